"""ZipLine on the Thrust backend; use cadence.zipline(rows, variant='thrust')."""

device_system: str
"""The Thrust device system this module was built for: 'omp' or 'cpp'."""

def _zipline(rows: object) -> tuple[int | float, int | float, list[int]]:
    """ZipLine with zipline_thrust; returns (spread, barrier, choice)."""
