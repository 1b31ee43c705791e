//! Generates the gRPC client and server of the web layer's tests and examples from `tests/proto`, with the
//! pure-Rust `protox` compiler: no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=tests/proto");
    let files = protox::compile(["tests/proto/shop.proto"], ["tests/proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(files)?;
    Ok(())
}
