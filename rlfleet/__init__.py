"""rlfleet: collect reinforcement-learning experience on a fleet of workers."""

from rlfleet._version import __version__

__all__ = ["__version__"]
