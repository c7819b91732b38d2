"""The decode sweep: decode speed and achieved bandwidth, one engine per process."""
