"""InOutSpec: the input and output spaces of a module (garage's ``InOutSpec``)."""

from __future__ import annotations

import gymnasium as gym


class InOutSpec:
    """Describes the input and output spaces of a primitive or module.

    Compares by value: two specs are equal when their spaces are.

    Args:
        input_space: Input space of the module.
        output_space: Output space of the module.
    """

    def __init__(self, input_space: gym.Space, output_space: gym.Space) -> None:
        self._input_space = input_space
        self._output_space = output_space

    @property
    def input_space(self) -> gym.Space:
        """Input space of the module."""
        return self._input_space

    @property
    def output_space(self) -> gym.Space:
        """Output space of the module."""
        return self._output_space

    def __eq__(self, other: object) -> bool:
        """Whether ``other`` is an InOutSpec with equal spaces."""
        if not isinstance(other, InOutSpec):
            return NotImplemented
        return (self.input_space, self.output_space) == (other.input_space, other.output_space)

    __hash__ = None  # type: ignore[assignment]  # gymnasium spaces are unhashable too

    def __repr__(self) -> str:
        return f"InOutSpec(input_space={self.input_space}, output_space={self.output_space})"
