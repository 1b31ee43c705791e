//! The hello-world axum service of the web layer's load benchmark (`scripts/bench-web` drives it with wrk).
//!
//! `cargo run --release -p sentinel-benches --example web_bench_server -- --variant VARIANT [--addr 127.0.0.1:8080] [--workers 1]`
//!
//! The variants (one layer each on `GET /hello`) are described in `benches/examples/support/web_variants.rs`.

use std::error::Error;
use std::net::SocketAddr;

#[path = "support/web_variants.rs"]
mod web_variants;

fn main() -> Result<(), Box<dyn Error>> {
    let mut variant = String::from("none");
    let mut addr: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut workers = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--variant" => variant = v,
            "--addr" => addr = v.parse()?,
            "--workers" => workers = v.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    rt.block_on(async move {
        // Built inside the runtime: tower's limiter keeps a tokio timer.
        let app = web_variants::app(&variant)?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!("{variant} on http://{}", listener.local_addr()?);
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
        Ok(())
    })
}
