/** Node-only helpers: files by their path, as `File`s (named, so a receipt's subject matches them). */
import { readFile } from "node:fs/promises";
import { basename } from "node:path";

/** The file at `path` as a `File` named by its last path component. */
export async function file(path: string, options: { type?: string } = {}): Promise<File> {
  const bytes = await readFile(path);
  return new File([bytes], basename(path), options.type === undefined ? {} : { type: options.type });
}

/** The text of the file at `path` (a PEM key, a receipt's JSON). */
export function text(path: string): Promise<string> {
  return readFile(path, "utf8");
}
