"""loom: a planned, virtual-memory GPU allocator for PyTorch training.

The package imports torch lazily: everything that does not need a GPU
(trace import, analysis, planning, comparison, the command line) works on a
machine without torch or CUDA.
"""

__version__ = "0.1.0"

# Snapshot import/export: pure Python (stdlib only), no torch.
from loom.snapshot_export import export_snapshot  # noqa: E402,F401
from loom.snapshot_import import import_snapshot  # noqa: E402,F401

__all__ = ["export_snapshot", "import_snapshot"]
