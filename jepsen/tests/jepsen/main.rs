//! The jepsen crate's integration tests: one binary, one module per scenario.

mod cli;
mod common;
mod controls;
mod etcd_register_recording;
mod harness_checks;
mod harness_register;
mod injected_anomalies;
mod membership_run;
mod properties;
mod proxy_mode;
mod report_svg;
mod revision_anomalies;
mod set_and_lost;
mod testdata;
mod ttl_clock;
