"""The data models of the HTTP API (``TypedDict``), generated from the service's OpenAPI
document into ``_models.py`` by ``scripts/gen_models.py``: a run record is a
:class:`RunView`, a listed run a :class:`RunSummary`, a task a :class:`TaskView`, an error
body a :class:`Problem`."""

from ._models import *  # noqa: F401,F403
from ._models import __all__ as __all__
