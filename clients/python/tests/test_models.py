"""The committed models (src/agentjail/_models.py) are what scripts/gen_models.py makes of the
running service's /openapi.json: a change of the API that the models do not follow fails
here (regenerate them with the script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, get_type_hints

import agentjail
from agentjail import models

HERE = Path(__file__).resolve().parent.parent


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_models", HERE / "scripts" / "gen_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_models_are_generated_from_this_services_document(client: agentjail.Client) -> None:
    document = client.openapi()
    want = generator().render(document)
    have = (HERE / "src" / "agentjail" / "_models.py").read_text()
    assert have == want, (
        "src/agentjail/_models.py differs from what the service's /openapi.json makes: "
        "run clients/python/scripts/gen_models.py URL/openapi.json src/agentjail/_models.py"
    )
    # Every schema is a model, and each object's keys are its properties.
    schemas = document["components"]["schemas"]
    assert sorted(models.__all__) == sorted(schemas)
    for name, schema in schemas.items():
        if schema.get("type") == "object" and "properties" in schema:
            cls = getattr(models, name)
            assert set(get_type_hints(cls)) == set(schema["properties"]), name
            assert cls.__required_keys__ == frozenset(schema.get("required", [])), name


def test_a_run_record_has_the_keys_of_its_model(client: agentjail.Client) -> None:
    run = client.run("py", code="print('hi')")
    keys = set(get_type_hints(models.RunView))
    assert set(run.record) <= keys, set(run.record) - keys
    assert models.RunView.__required_keys__ <= set(run.record)
    assert sys.version_info >= (3, 9)
