//! Entry points for fuzz targets and hostile-peer tests. Not part of the stable API.
