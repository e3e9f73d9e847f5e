"""Environments: the contract (``Environment``, ``MultiTurnEnv``, ``SingleTurnEnv``,
``ToolEnv``, ``State``, ``@stop``), scoring (``Rubric``, ``Parser``, ``XMLParser``,
``ThinkParser``), datasets of any size (``LazyRows``: rows built when read), loading (``load_environment``), ``check_environment`` and ``scaffold_environment``
(what ``vf-mm init`` writes)."""

from vf_mm.envs._check import check_environment
from vf_mm.envs._env import Environment, MultiTurnEnv, SingleTurnEnv, State, stop
from vf_mm.envs._loading import (
    ENTRY_POINT_GROUP,
    list_environments,
)
from vf_mm.envs._parser import Parser, ThinkParser, XMLParser
from vf_mm.envs._rows import LazyRows
from vf_mm.envs._rubric import Rubric
from vf_mm.envs._scaffold import scaffold_environment
from vf_mm.envs._tools import ToolEnv, tool_schema

__all__ = [
    "ENTRY_POINT_GROUP",
    "Environment",
    "LazyRows",
    "MultiTurnEnv",
    "Parser",
    "Rubric",
    "SingleTurnEnv",
    "State",
    "ThinkParser",
    "ToolEnv",
    "XMLParser",
    "check_environment",
    "list_environments",
    "scaffold_environment",
    "stop",
    "tool_schema",
]
