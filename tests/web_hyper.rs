//! The web layer on plain hyper 1 (no axum): a tower service made into a hyper service with hyper-util's
//! `TowerToHyperService`, the peer address given as a `PeerAddr` extension, names from the cleaned path.

mod web_support;

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, PeerAddr, SentinelLayer};
use tower::ServiceBuilder;
use web_support::{bounded, client, engine_at, stats};

async fn handler(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from(format!("item at {}", req.uri().path())))))
}

/// An accept loop as a hyper user writes it: one connection task per client, the layer per connection.
async fn serve(layer: SentinelLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    req
                })
                .layer(layer.clone())
                .service_fn(handler);
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    addr
}

#[tokio::test]
async fn hyper_without_axum_names_requests_by_cleaned_path_and_answers_429() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("GET:/items/{id}").count(2.0)]).unwrap();
        let addr = serve(SentinelLayer::new(&engine)).await;
        let http = client();
        for id in [1, 2] {
            let r = http.get(format!("http://{addr}/items/{id}?x={id}")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.text().await.unwrap(), format!("item at /items/{id}"));
        }
        let r = http.get(format!("http://{addr}/items/3")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(engine.resource_names(), vec!["GET:/items/{id}".to_string()]);
        let s = stats(&engine, "GET:/items/{id}");
        assert_eq!((s.minute_pass, s.minute_block, s.threads), (2, 1, 0));
    })
    .await
}

#[tokio::test]
async fn hyper_peer_addr_extension_feeds_the_peer_ip_hot_parameter() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_param_flow_rules([ParamFlowRule::new("POST:/orders", 0).count(1.0)]).unwrap();
        let addr = serve(SentinelLayer::new(&engine).param(extract::peer_ip())).await;
        let http = client();
        assert_eq!(http.post(format!("http://{addr}/orders")).send().await.unwrap().status(), StatusCode::OK);
        assert_eq!(http.post(format!("http://{addr}/orders")).send().await.unwrap().status(), 429);
        assert_eq!(engine.param_flow_tracked("POST:/orders"), vec![(1, 4000)], "one value: 127.0.0.1");
    })
    .await
}

#[tokio::test]
async fn hyper_names_head_as_get_and_extension_methods_share_one_resource() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("GET:/items/{id}").count(1.0)]).unwrap();
        let addr = serve(SentinelLayer::new(&engine)).await;
        let http = client();
        assert_eq!(http.head(format!("http://{addr}/items/1")).send().await.unwrap().status(), StatusCode::OK);
        let r = http.get(format!("http://{addr}/items/2")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "the HEAD counted under the GET rule");
        for i in 0..100 {
            let m = reqwest::Method::from_bytes(format!("M{i}").as_bytes()).unwrap();
            http.request(m, format!("http://{addr}/items/1")).send().await.unwrap();
        }
        let mut names = engine.resource_names();
        names.sort();
        assert_eq!(names, ["GET:/items/{id}", sentinel_runtime::web::OTHER_METHODS_RESOURCE]);
    })
    .await
}
