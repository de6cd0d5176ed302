"""corral: a facility-side gateway through which AI coding agents act on an HPC cluster."""

__version__ = "0.1.0"
