//! Integration tests of the bitcask engine: one binary, a module per scenario.
