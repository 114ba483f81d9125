//! Typed units (bytes, seconds, bytes/s). Being filled in.
