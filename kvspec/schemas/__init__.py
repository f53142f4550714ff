"""The JSON Schemas of what the kit writes, shipped with it, and one way to check a document against them.

Each schema is a file here (``<name>.schema.json``, JSON Schema 2020-12) carrying its own
version; writers name the version in the document (``kvspec_report: 1``). :func:`problems`
lists every way a document departs from its schema, each as one line that names the place
(``runs[1].summary.ttft_median_s is missing``), so a reader can reject a file with a one-line
error and a test can assert on the place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

SCHEMAS = ("report", "case", "bench-live", "baseline", "gate")


@cache
def schema(name: str) -> dict[str, Any]:
    """The schema called ``name`` (one of SCHEMAS), as a dict."""
    if name not in SCHEMAS:
        raise ValueError(f"unknown schema {name!r}; known: {', '.join(SCHEMAS)}")
    text = resources.files(__name__).joinpath(f"{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema(name))


def where(path: Iterable[str | int]) -> str:
    """A JSON path as the kit writes it: ``runs[1].summary``; empty for the document itself."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _missing(error: ValidationError, key: str) -> list[str]:
    """Where a missing ``key`` leaves a hole: the key itself or, for an object whose schema is written in
    place beside the ``required``, the keys that object must hold (``arms.unique``: what to add)."""
    declared = error.schema.get("properties", {}).get(key, {}) if isinstance(error.schema, Mapping) else {}
    inner = declared.get("required", []) if isinstance(declared, Mapping) else []
    return [where([*error.absolute_path, key, sub]) for sub in inner] or [where([*error.absolute_path, key])]


def _lines(error: ValidationError) -> list[str]:
    place = where(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict) and isinstance(error.validator_value, list):
        return [
            f"{hole} is missing"
            for key in error.validator_value
            if key not in error.instance
            for hole in _missing(error, key)
        ]
    if error.validator == "type":
        wanted = error.validator_value
        names = " or ".join(wanted) if isinstance(wanted, list) else str(wanted)
        got = "null" if error.instance is None else type(error.instance).__name__
        return [f"{place or 'the document'} is {got}, not {names}"]
    return [f"{place or 'the document'}: {error.message}"]


def problems(document: Any, name: str) -> list[str]:
    """Every way ``document`` departs from schema ``name`` (empty when it conforms), in document order."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    # jsonschema reports each missing key of a "required" as an error of its own: one line per hole.
    return list(dict.fromkeys(line for error in errors for line in _lines(error)))


def check(document: Any, name: str) -> None:
    """Raise ValueError with the first few problems when ``document`` does not conform to schema ``name``."""
    found = problems(document, name)
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise ValueError(f"not a valid {name}: {'; '.join(found[:3])}{more}")


__all__ = ["SCHEMAS", "check", "problems", "schema", "where"]
