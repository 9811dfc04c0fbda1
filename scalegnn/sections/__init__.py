"""The sections of the run configuration, declared where no torch loads.

:class:`scalegnn.config.RunConfig` is one kw-only dataclass per component (its
docstring lists them). A component owns its section: it reads it, its docstring says
what each setting does, and the section checks its values in ``__post_init__``. This
package holds the sections of the components that compute with torch (the data, the
sampler, the model, the optimizer, the loop, the grid, checkpoints, the speed
switches), one module each, importing nothing heavier than the standard library, so
that ``scalegnn --help``, a refused flag and the first line of a run come before torch
loads (``tests/integration/test_start.py``). Each component re-exports its section
(``scalegnn.model.ModelConfig`` is ``scalegnn.sections.model.ModelConfig``);
:mod:`scalegnn.numerics` loads no torch and declares its own.
"""
