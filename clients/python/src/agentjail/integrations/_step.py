"""The program each smolagents step runs as in the sandbox (``TEMPLATE``; see its comments).
Kept as text: it runs in the sandbox's Python, not in the client's."""

TEMPLATE = r"""# The program each smolagents step runs as, in the sandbox (a cell of the executor's
# session). The executor fills in the JSON literal `__AGENTJAIL_STEP__` (this file is a
# template: it is read as text, never imported). Everything it keeps between steps lives in
# the session's /work, bounded by the task's `session.max_mb`:
#
# - /work/.agentjail_state.pkl: the step's globals that can be pickled (dill when the
#   sandbox's Python has it, else pickle), each on its own, so that one that cannot be
#   pickled or restored loses only itself, and is named in the logs the agent sees;
# - /work/.agentjail_defs.py: the source of the top-level `def` and `class` statements of
#   earlier steps, defined again before the state is restored (a definition, not a replay of
#   a step: no other statement of an earlier step runs again);
# - /work/.agentjail_tools.py: the tools' definitions (smolagents' `send_tools`), and the
#   imported modules' names, imported again.
#
# It writes its report (the final answer, the last expression's value, what was not kept) to
# the task's output file, and exits 1 after an error in the agent's code, whose traceback
# goes to stderr.
import ast as _aj_ast
import json as _aj_json
import os as _aj_os
import pickle as _aj_std_pickle
import sys as _aj_sys
import traceback as _aj_tb
import types as _aj_types

_aj_step = _aj_json.loads(__AGENTJAIL_STEP__)  # noqa: F821 (filled in by the executor)
_AJ_STATE = "/work/.agentjail_state.pkl"
_AJ_DEFS = "/work/.agentjail_defs.py"
_AJ_TOOLS = "/work/.agentjail_tools.py"
_aj_report = {
    "final_answer": None,
    "output": None,
    "error": None,
    "skipped": [],
    "unrestored": [],
    "missing_imports": [],
}
try:
    import dill as _aj_pickle

    _aj_report["pickler"] = "dill"
except ImportError:
    _aj_pickle = _aj_std_pickle
    _aj_report["pickler"] = "pickle"


def _aj_note(kind, name):
    if len(_aj_report[kind]) < 200:
        _aj_report[kind].append(name)


# 1. The tools (written once, by the step after `send_tools`), defined again in each step.
if _aj_step["tools"] is not None:
    with open(_AJ_TOOLS, "w") as _aj_f:
        _aj_f.write(_aj_step["tools"])
_aj_tools = {}
if _aj_os.path.exists(_AJ_TOOLS):
    _aj_before = dict(globals())
    exec(compile(open(_AJ_TOOLS).read(), _AJ_TOOLS, "exec"), globals())
    _aj_tools = {k: v for k, v in globals().items() if _aj_before.get(k, _aj_tools) is not v}

# 2. The state of earlier steps: modules, definitions, then values.
_aj_saved = {"modules": {}, "values": {}}
if _aj_os.path.exists(_AJ_STATE):
    with open(_AJ_STATE, "rb") as _aj_f:
        _aj_saved = _aj_std_pickle.load(_aj_f)
for _aj_n, _aj_m in _aj_saved["modules"].items():
    try:
        globals()[_aj_n] = __import__(_aj_m, fromlist=["_"])
    except Exception:
        _aj_note("unrestored", _aj_n)
_aj_defs = []
if _aj_os.path.exists(_AJ_DEFS):
    with open(_AJ_DEFS) as _aj_f:
        _aj_defs = _aj_json.load(_aj_f)
_aj_later = []
for _aj_n, _aj_src in _aj_defs:
    try:
        exec(compile(_aj_src, "<definition of %s>" % _aj_n, "exec"), globals())
    except Exception:
        _aj_later.append((_aj_n, _aj_src))
for _aj_n, _aj_b in _aj_saved["values"].items():
    try:
        globals()[_aj_n] = _aj_pickle.loads(_aj_b)
    except Exception:
        _aj_note("unrestored", _aj_n)
for _aj_n, _aj_src in _aj_later:
    try:
        exec(compile(_aj_src, "<definition of %s>" % _aj_n, "exec"), globals())
    except Exception:
        _aj_note("unrestored", _aj_n)

# 3. Variables sent by the agent (`send_variables`), once.
if _aj_step["variables"] is not None:
    _aj_ns = {}
    exec(_aj_step["variables"], _aj_ns)
    globals().update(_aj_ns["vars_dict"])

# 4. What the agent may import, checked against this Python (nothing is installed).
if _aj_step["imports"]:
    import importlib.util as _aj_iu

    for _aj_n in _aj_step["imports"]:
        try:
            _aj_found = _aj_iu.find_spec(_aj_n.split(".")[0]) is not None
        except (ImportError, ValueError):
            _aj_found = False
        if not _aj_found:
            _aj_note("missing_imports", _aj_n)

# 5. The agent's code; the value of a last expression is the step's output.
_aj_status = 0
_aj_tree = None
try:
    _aj_tree = _aj_ast.parse(_aj_step["code"], "<agent step>")
    _aj_last = None
    if _aj_tree.body and isinstance(_aj_tree.body[-1], _aj_ast.Expr):
        _aj_last = _aj_ast.Expression(_aj_tree.body.pop().value)
    exec(compile(_aj_tree, "<agent step>", "exec"), globals())
    if _aj_last is not None:
        _aj_value = eval(compile(_aj_last, "<agent step>", "eval"), globals())
        if _aj_value is not None:
            _aj_report["output"] = repr(_aj_value)[:4000]
except BaseException as _aj_e:  # noqa: B036 (the agent's code may raise anything)
    if type(_aj_e).__name__ == "FinalAnswerException":
        _aj_report["final_answer"] = _aj_e.value
    else:
        _aj_status = 1
        _aj_report["error"] = ("%s: %s" % (type(_aj_e).__name__, _aj_e))[:2000]
        _aj_tb.print_exception(type(_aj_e), _aj_e, _aj_e.__traceback__.tb_next)

# 6. Keep what can be kept: definitions as source, modules by name, values pickled.
if _aj_tree is not None:
    _aj_src = _aj_step["code"].splitlines(True)
    for _aj_node in _aj_tree.body:
        if isinstance(
            _aj_node, (_aj_ast.FunctionDef, _aj_ast.AsyncFunctionDef, _aj_ast.ClassDef)
        ):
            _aj_v = globals().get(_aj_node.name)
            if getattr(_aj_v, "__module__", None) == "__main__":
                _aj_first = min(
                    [_aj_node.lineno] + [d.lineno for d in _aj_node.decorator_list]
                )
                _aj_defs = [d for d in _aj_defs if d[0] != _aj_node.name]
                _aj_defs.append(
                    (_aj_node.name, "".join(_aj_src[_aj_first - 1 : _aj_node.end_lineno]))
                )
_aj_defined = {n for n, _ in _aj_defs}
_aj_keep = {"modules": {}, "values": {}}
for _aj_n, _aj_v in list(globals().items()):
    if _aj_n.startswith("_aj_") or (_aj_n.startswith("__") and _aj_n.endswith("__")):
        continue
    if _aj_tools.get(_aj_n, _aj_keep) is _aj_v:
        continue
    if isinstance(_aj_v, _aj_types.ModuleType):
        _aj_keep["modules"][_aj_n] = _aj_v.__name__
        continue
    if _aj_n in _aj_defined and getattr(_aj_v, "__module__", None) == "__main__":
        continue
    if _aj_report["pickler"] == "pickle" and getattr(_aj_v, "__module__", None) == "__main__" and (
        isinstance(_aj_v, (type, _aj_types.FunctionType))
    ):
        # pickle names a function or class of __main__ by reference: it would not load.
        _aj_note("skipped", _aj_n)
        continue
    try:
        _aj_keep["values"][_aj_n] = _aj_pickle.dumps(_aj_v)
    except Exception:
        _aj_note("skipped", _aj_n)
with open(_AJ_STATE + ".tmp", "wb") as _aj_f:
    _aj_std_pickle.dump(_aj_keep, _aj_f)
_aj_os.replace(_AJ_STATE + ".tmp", _AJ_STATE)
with open(_AJ_DEFS, "w") as _aj_f:
    _aj_json.dump(_aj_defs, _aj_f)
with open(_aj_step["output"], "w") as _aj_f:
    _aj_json.dump(_aj_report, _aj_f)
_aj_sys.stdout.flush()
_aj_sys.exit(_aj_status)
"""

#: The marker of the report line a live step prints last on its stdout.
LIVE_MARKER = "\x1eagentjail-step "

LIVE_TEMPLATE = r"""# The program each smolagents step runs as in a LIVE session (a task with
# `session.interpreter = "python"`: docs/api.md, "Live sessions"). The session's resident
# interpreter executes it in the globals it keeps between cells, so nothing is pickled,
# replayed or defined again: variables, imports, functions, lambdas and generators of earlier
# steps are simply there. The executor fills in the JSON literal `__AGENTJAIL_STEP__`. A live
# cell has no output file: the report (the final answer, the last expression's value, the
# imports this Python lacks) is the last line of the step's stdout, after a marker; an error
# in the agent's code prints its traceback to stderr and ends the cell with status 1.
import json as _aj_json

_aj_step = _aj_json.loads(__AGENTJAIL_STEP__)  # noqa: F821 (filled in by the executor)
_aj_report = {"final_answer": None, "output": None, "error": None, "missing_imports": []}

# 1. The tools (smolagents' `send_tools`) and the agent's variables (`send_variables`), once:
# they stay in the interpreter's globals.
if _aj_step["tools"] is not None:
    exec(compile(_aj_step["tools"], "<tools>", "exec"), globals())
if _aj_step["variables"] is not None:
    _aj_ns = {}
    exec(_aj_step["variables"], _aj_ns)
    globals().update(_aj_ns["vars_dict"])

# 2. What the agent may import, checked against this Python (nothing is installed).
if _aj_step["imports"]:
    import importlib.util as _aj_iu

    for _aj_n in _aj_step["imports"]:
        try:
            _aj_found = _aj_iu.find_spec(_aj_n.split(".")[0]) is not None
        except (ImportError, ValueError):
            _aj_found = False
        if not _aj_found:
            _aj_report["missing_imports"].append(_aj_n)

# 3. The agent's code; the value of a last expression is the step's output.
import ast as _aj_ast
import sys as _aj_sys
import traceback as _aj_tb

_aj_status = 0
try:
    _aj_tree = _aj_ast.parse(_aj_step["code"], "<agent step>")
    _aj_last = None
    if _aj_tree.body and isinstance(_aj_tree.body[-1], _aj_ast.Expr):
        _aj_last = _aj_ast.Expression(_aj_tree.body.pop().value)
    exec(compile(_aj_tree, "<agent step>", "exec"), globals())
    if _aj_last is not None:
        _aj_value = eval(compile(_aj_last, "<agent step>", "eval"), globals())
        if _aj_value is not None:
            _aj_report["output"] = repr(_aj_value)[:4000]
except KeyboardInterrupt:
    raise  # the cell's time limit: the interpreter says `interrupted`
except BaseException as _aj_e:  # noqa: B036 (the agent's code may raise anything)
    if type(_aj_e).__name__ == "FinalAnswerException":
        _aj_report["final_answer"] = _aj_e.value
    else:
        _aj_status = 1
        _aj_report["error"] = ("%s: %s" % (type(_aj_e).__name__, _aj_e))[:2000]
        _aj_tb.print_exception(type(_aj_e), _aj_e, _aj_e.__traceback__.tb_next)
_aj_sys.stdout.flush()
print("\n" + __AGENTJAIL_MARKER__ + _aj_json.dumps(_aj_report))  # noqa: F821
if _aj_status:
    raise SystemExit(_aj_status)
""".replace("__AGENTJAIL_MARKER__", repr(LIVE_MARKER))
