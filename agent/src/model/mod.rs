//! The chapter's models (models.md) as pure functions. Being filled in.
