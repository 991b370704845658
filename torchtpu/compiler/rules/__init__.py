"""Lowering rules, one module per op family. Importing this package registers them all."""
from torchtpu.compiler.rules import (  # noqa: F401
    attention,
    creation,
    elementwise,
    linalg,
    nn,
    random,
    reduction,
    scalar,
    shape,
)
