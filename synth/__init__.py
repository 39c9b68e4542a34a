"""synth: constraint-solver-driven schedule synthesis for tensor programs."""

__version__ = "0.1.0"
