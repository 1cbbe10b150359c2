//! Placeholder until its module lands.
