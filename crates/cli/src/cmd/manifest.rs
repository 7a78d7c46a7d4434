//! `agentjail manifest`: the manifest that `run` flags describe, or the format's JSON Schema.

use agentjail_manifest::Manifest;
use clap::Args;

use crate::flags::ManifestFlags;
use crate::out::print_json;

#[derive(Args)]
pub struct ManifestArgs {
    /// Print the JSON Schema of the manifest format.
    #[arg(long, conflicts_with = "print")]
    schema: bool,
    /// Print the manifest (JSON) that the given `run` flags produce.
    #[arg(long)]
    print: bool,
    #[command(flatten)]
    flags: ManifestFlags,
}

pub fn run(a: ManifestArgs) -> Result<u8, String> {
    if a.schema {
        print_json(&Manifest::json_schema());
        Ok(0)
    } else if a.print {
        print_json(&a.flags.to_manifest()?);
        Ok(0)
    } else {
        Err("manifest: give --schema or --print".into())
    }
}
