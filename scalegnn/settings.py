"""Settings: dataclass fields that carry their command-line flag and help.

Every component owns its configuration as a kw-only dataclass whose fields are
declared with :func:`setting`. A field's name is its name everywhere: in the run
configuration, in the run record (``config.<section>.<name>``) and, by default, on
the command line (``--<name>`` with dashes). :mod:`scalegnn.config` builds the
``scalegnn train`` parser from these declarations, so a new setting is one field.
A few flags keep a name of their own (``--out``, ``--quiet``, the checkpoint
flags): they say so in ``flag`` and appear in the one table of flag -> setting
(``scalegnn.config.flag_table``, printed in ``results/README.md``).

``scope`` says which systems read a setting: "common" (every system), "scalegnn"
(ScaleGNN and its full-graph mode), or, for the fields of a compared system's own
options dataclass, that system alone (they are shown under ``--system NAME --help``).
``output`` marks a setting that names a folder the run writes to (``--out``,
``--checkpoint-dir``, ``--profile``): every such folder is checked before any work
(:meth:`scalegnn.config.RunConfig.output_folders`), so a finished run is never lost
to a bad path.

``rare`` marks a setting that a first run or a typical sweep never sets (an ablation
switch, a diagnostic, a knob whose default is the evidence's choice): ``scalegnn
train --help`` hides its flag, which stays accepted as before, and ``--help-all``
(every flag) and ``--help-topic TOPIC`` (one section's flags) show it. Each rare
setting says why at its declaration.
"""

from __future__ import annotations

import dataclasses

__all__ = ["setting", "flag_of", "is_setting", "render_of", "fraction", "int_tuple", "SCOPES"]

SCOPES = ("common", "scalegnn")


def setting(default=dataclasses.MISSING, *, help: str, flag: str | None = None, scope: str = "common",
            render=None, output: bool = False, rare: bool = False, default_factory=dataclasses.MISSING,
            **argparse_kw):
    """A dataclass field that is a user setting: ``help`` for ``--help``, ``flag`` when
    the command line calls it otherwise than ``--<name>``, ``scope`` (see the module
    doc), ``render`` when a value is written back as a flag value otherwise than
    :func:`render_value` does (the inverse of ``type``), ``output`` when its value is
    a folder the run writes to, ``rare`` when ``--help`` hides its flag (both: see the
    module doc), and extra ``argparse`` keywords (``type``, ``choices``, ``action``,
    ``const``, ``metavar``) where the annotation alone does not say how to parse it."""
    if scope not in SCOPES and not scope.startswith("system:"):
        raise ValueError(f"scope must be one of {SCOPES} or 'system:NAME', got {scope!r}")
    metadata = {"help": help, "flag": flag, "scope": scope, "render": render, "output": output,
                "rare": rare, "argparse": argparse_kw}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def is_setting(f: dataclasses.Field) -> bool:
    """True for the fields declared with :func:`setting` (the others are internal)."""
    return "help" in f.metadata


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a setting: its own ``flag``, else ``--<name>`` dashed."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def render_value(value) -> str:
    """A setting's value as its flag takes it: tuples comma-separated (``15,10,5``)."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def render_of(f: dataclasses.Field):
    """How a setting's value is written as a flag value (its ``render``, else :func:`render_value`)."""
    return f.metadata.get("render") or render_value


# ---------------------------------------------------------------------------- parse functions of flags
def fraction(text) -> float:
    """A fraction in (0, 1] (a batch ratio, a target accuracy)."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"expected a fraction in (0, 1], got {text}")
    return value


def int_tuple(text) -> tuple[int, ...]:
    """``"15,10,5"`` -> ``(15, 10, 5)`` (fan-outs); tuples and lists pass through."""
    if isinstance(text, (tuple, list)):
        return tuple(int(v) for v in text)
    try:
        return tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers such as 15,10,5, got {text!r}") from None
