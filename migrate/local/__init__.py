"""The local modules a script imports, read with ast before any conversion: what they build, download and import."""
