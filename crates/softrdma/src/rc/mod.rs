//! Reliable Connected transport (sans-IO).
