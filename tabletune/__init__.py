"""TableTune: measured draft-length tables for speculative decoding."""

from tabletune.table import DraftTable
from tabletune.profile import StepProfile

__all__ = ["DraftTable", "StepProfile"]
__version__ = "0.1.0"
