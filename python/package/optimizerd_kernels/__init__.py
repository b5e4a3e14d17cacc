"""PLACEHOLDER (export-python branch): the lead's runtime package replaces this file on merge."""
from pathlib import Path

KERNELS = Path(__file__).parent / "kernels"
