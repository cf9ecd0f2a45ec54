"""Nested config mappings: deep merge, dotted-path overrides and field-level differences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in override.items():
        both_mappings = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = deep_merge(out[key], value) if both_mappings else value
    return out


def get_dotted(config: Mapping[str, Any], path: str) -> Any:
    """The field at dotted ``path`` (``"attention.window_size"``) of ``config`` (``KeyError`` when absent)."""
    for part in path.split("."):
        config = config[part]
    return config


def has_dotted(config: Mapping[str, Any], path: str) -> bool:
    """Whether ``config`` holds a field at dotted ``path`` (every section on the way a mapping)."""
    head, _, rest = path.partition(".")
    if not isinstance(config, Mapping) or head not in config:
        return False
    return has_dotted(config[head], rest) if rest else True


def without_dotted(config: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``config`` without the field at dotted ``path`` (the same fields when it holds none)."""
    head, _, rest = path.partition(".")
    out = dict(config)
    if not rest:
        out.pop(head, None)
    elif isinstance(out.get(head), Mapping):
        out[head] = without_dotted(out[head], rest)
    return out


def set_dotted(config: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``config`` with the field at dotted ``path`` (``"attention.window_size"``) set to ``value``.

    Intermediate sections are created when absent; a mapping ``value`` merges into the section
    it names instead of replacing it (:func:`deep_merge`).
    """
    head, _, rest = path.partition(".")
    if rest:
        section = config.get(head)
        value = set_dotted(section if isinstance(section, Mapping) else {}, rest, value)
    return deep_merge(config, {head: value})


@dataclass(frozen=True)
class FieldChange:
    """One changed field of a config: its dotted path, the old and the new value (None: absent)."""

    field: str  # dotted path, e.g. "steps" or "stage1.lr"
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: {self.old!r} -> {self.new!r}"


def config_diff(old: Any, new: Any, prefix: str = "") -> list[FieldChange]:
    """Field-level differences between two JSON-like configs, nested fields as dotted paths.

    Order: the fields of ``old`` as they appear, then the fields only ``new`` has.
    """
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        changes: list[FieldChange] = []
        for key in [*old, *(k for k in new if k not in old)]:
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in new:
                changes.append(FieldChange(path, old[key], None))
            elif key not in old:
                changes.append(FieldChange(path, None, new[key]))
            else:
                changes += config_diff(old[key], new[key], path)
        return changes
    return [] if old == new else [FieldChange(prefix or "config", old, new)]
