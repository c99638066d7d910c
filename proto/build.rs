//! Generates the protobuf messages and the tonic clients and servers of
//! `proto/*.proto` and `proto/etcd/**.proto` into `OUT_DIR`.
//!
//! The `.proto` files are compiled by `protox`, a protobuf compiler written in
//! Rust, into a descriptor set that `tonic-prost-build` turns into code: the
//! build needs no system `protoc`.

use std::error::Error;
use std::path::Path;

/// Where the `.proto` files live (also the import root: `import "kv.proto";`).
const PROTO_DIR: &str = "proto";
/// The files to compile; one module of the crate per file (see `src/lib.rs`).
/// The `etcd/` files are etcd 3.4's wire format (the etcd port's), each in
/// its own protobuf package as etcd has it.
const PROTO_FILES: [&str; 8] = [
    "kv.proto",
    "cluster.proto",
    "raft.proto",
    "etcd/mvccpb/kv.proto",
    "etcd/authpb/auth.proto",
    "etcd/etcdserverpb/rpc.proto",
    "etcd/v3lockpb/v3lock.proto",
    "etcd/v3electionpb/v3election.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={PROTO_DIR}/{file}");
    }
    let paths = PROTO_FILES.map(|file| Path::new(PROTO_DIR).join(file));
    // `compile` keeps the source info, so proto comments become doc comments.
    let descriptors = protox::compile(paths, [PROTO_DIR]).map_err(|error| error.to_string())?;
    tonic_prost_build::configure()
        // Every `bytes` field is `prost::bytes::Bytes`: decoding slices the
        // request buffer instead of copying values, Raft payloads and
        // snapshot chunks.
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
