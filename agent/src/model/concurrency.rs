//! Being filled in (issue 3).
