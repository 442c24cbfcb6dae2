"""The server's version, in a module of its own: modules inside the package import it from here, not
from the package root, whose lazy re-export of ``Transformer`` (for handler authors) would otherwise
make every layer that reports a version depend on the transformer component."""

__version__ = "0.1.0"
