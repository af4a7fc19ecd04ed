"""One file per method; ``resolve`` layers a recipe's defaults, a preset, a YAML file and --set overrides.

Every module of this package but ``base`` and ``generator`` is a recipe, imported here so that its ``@register``
runs: a new recipe is a new file, with no import list to edit. A recipe from the user's own package registers through
the ``coevolve.recipes`` entry point group (``[project.entry-points."coevolve.recipes"] my_recipe =
"my_package.module:MyRecipe"``, the class or a module whose ``@register`` runs on import); a name a built-in
recipe has is refused with one ConfigError.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from coevolve.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    RoleSettings,
    RunConfig,
    deep_merge,
    load_yaml,
    parse_set,
    to_yaml,
    validate,
)
from coevolve.evaluation.harness import EVAL_PRESETS
from coevolve.formats import GeneratorFormat
from coevolve.recipes.base import RECIPES, Recipe, RecipeParams, register
from coevolve.recipes.generator import GeneratorRecipe

ENTRY_POINTS = "coevolve.recipes"  # the entry point group of recipes from other packages


def _load_entry_points() -> None:
    """Register the recipes that installed packages declare in the ``coevolve.recipes`` entry point group."""
    for point in entry_points(group=ENTRY_POINTS):
        try:
            target = point.load()
        except Exception as exc:  # a broken user package: one line naming the entry point
            raise ConfigError(f"the {ENTRY_POINTS} entry point {point.name} = {point.value} does not load: "
                              f"{type(exc).__name__}: {exc}") from None
        if isinstance(target, type) and issubclass(target, Recipe):
            register(target)
        elif not isinstance(target, ModuleType):
            raise ConfigError(f"the {ENTRY_POINTS} entry point {point.name} = {point.value} is neither a Recipe "
                              f"class nor a module of recipes")


for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "generator"):
        importlib.import_module(f"{__name__}.{_module.name}")
_load_entry_points()

__all__ = ["FORMATS", "RECIPES", "Recipe", "resolve", "resolve_saved"]

# The generators' chat output formats by recipe name (each declared in its recipe's file).
FORMATS: dict[str, GeneratorFormat] = {name: cls.formats["chat"] for name, cls in RECIPES.items()
                                       if issubclass(cls, GeneratorRecipe) and "chat" in cls.formats}


def default_eval_sets(task: str) -> list[str]:
    """What a run evaluates when the config names no sets."""
    if task == "arith":
        return [f"arith_l{level}" for level in range(1, 7)]
    if task == "program":
        return ["prog_deduction", "prog_abduction", "prog_induction"]
    return {"math": ["gsm8k", "math500"], "mcq": ["supergpqa"]}.get(task, [])


def _finish(raw: dict[str, Any], recipe_name: str) -> tuple[RunConfig, RecipeParams, type[Recipe]]:
    cls = RECIPES[recipe_name]
    moved = {f"{role}_{key}": f"roles.{role}.{key}" for role in cls.roles for key in RoleSettings.model_fields}
    config, params = validate(raw, cls.Params, renamed={**moved, **cls.Params.renamed})
    if config.eval_preset not in EVAL_PRESETS:
        raise ConfigError(f"config key 'eval_preset': unknown evaluation preset {config.eval_preset!r} (known: "
                          f"{', '.join(EVAL_PRESETS)})")
    if config.eval_sets is None:
        config.eval_sets = default_eval_sets(config.task)
    cls.check_settings(config, params)
    saved = len(to_yaml(config).encode("utf-8"))
    if saved > MAX_CONFIG_BYTES:  # config.yaml must read back: a run that cannot resume is not started
        raise ConfigError(f"the resolved config is {saved} bytes as config.yaml, over the {MAX_CONFIG_BYTES >> 20} "
                          f"MiB a config file may have")
    return config, params, cls


def resolve(recipe_name: str, *, preset: str | None = None, config_file: str | None = None,
            sets: Sequence[str] = ()) -> tuple[RunConfig, RecipeParams, type[Recipe]]:
    """Recipe defaults < preset < config file < --set; validated, with nothing written."""
    if recipe_name not in RECIPES:
        raise ConfigError(f"unknown recipe '{recipe_name}' (known: {', '.join(sorted(RECIPES))})")
    cls = RECIPES[recipe_name]
    layers: list[dict[str, Any]] = [deep_merge({"recipe": recipe_name}, cls.defaults)]
    if preset is not None:
        if preset not in cls.presets:
            known = ", ".join(sorted(cls.presets)) or "none"
            raise ConfigError(f"recipe '{recipe_name}' has no preset '{preset}' (presets: {known})")
        layers.append(cls.presets[preset])
    if config_file:
        file_raw = load_yaml(config_file)
        if file_raw.get("recipe", recipe_name) != recipe_name:
            raise ConfigError(f"config key 'recipe': file says {file_raw['recipe']!r}, command says {recipe_name!r}")
        layers.append(file_raw)
    layers.append(parse_set(list(sets)))
    return _finish(_merge_layers(layers), recipe_name)


def resolve_saved(config_file: str, sets: Sequence[str] = ()) -> tuple[RunConfig, RecipeParams, type[Recipe]]:
    """A run directory's saved config, with --set overrides (e.g. more steps) on top."""
    raw = _merge_layers([load_yaml(config_file), parse_set(list(sets))])
    name = raw.get("recipe")
    if name not in RECIPES:
        raise ConfigError(f"config key 'recipe': unknown recipe {name!r}")
    return _finish(raw, name)


def _merge_layers(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The layers merged in order, each over the ones before. An ``eval_preset`` that names a paper's protocol
    brings that protocol's budget (``EVAL_PRESETS[...].max_new_tokens`` as ``eval_max_new_tokens``) unless the layer
    that names it, or one above it, sets ``eval_max_new_tokens`` itself."""
    raw: dict[str, Any] = {}
    for layer in layers:
        raw = deep_merge(raw, layer)
    named = [i for i, layer in enumerate(layers) if "eval_preset" in layer]
    chosen = raw.get("eval_preset")
    protocol = EVAL_PRESETS.get(chosen) if isinstance(chosen, str) else None  # unknown: _finish says so
    if named and protocol is not None and protocol.protocol and not any(
            "eval_max_new_tokens" in layer for layer in layers[named[-1]:]):
        raw["eval_max_new_tokens"] = protocol.max_new_tokens
    return raw
