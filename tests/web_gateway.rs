//! The web layer's gateway mode in a real axum server, called by a real HTTP client over loopback: API
//! groups (Ant-style prefix and regex paths) as resources of their own, gateway flow rules by URL parameter,
//! header, cookie, host and client IP (with and without trusted proxies), `burst` and `intervalSec`, and
//! gateway rules living beside the user's own hot-parameter rules.

mod web_support;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::gateway::{
    ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ParamMatchStrategy, ResourceMode,
};
use sentinel_runtime::web::{RateLimitHeaders, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::ServiceExt;
use web_support::{bounded, client, engine_at, serve, stats};

/// A gateway's routes, the layer in gateway mode on the matched ones.
fn app(engine: &Sentinel, proxies: TrustedProxies) -> Router {
    Router::new()
        .route("/product/{id}", get(|| async { "product" }))
        .route("/product/{id}/reviews", get(|| async { "reviews" }))
        .route("/item/{id}", get(|| async { "item" }))
        .route("/search", get(|| async { "results" }))
        .route_layer(SentinelLayer::new(engine).method_prefix(false).gateway(proxies))
}

/// Sends `n` requests built by `req` and returns their statuses.
async fn statuses(n: usize, req: impl Fn() -> reqwest::RequestBuilder) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(req().send().await.expect("request").status().as_u16());
    }
    out
}

fn api_rule(api: &str, count: f64) -> GatewayFlowRule {
    GatewayFlowRule::new(api).resource_mode(ResourceMode::CustomApiName).count(count)
}

#[tokio::test]
async fn requests_to_an_api_groups_paths_count_on_the_groups_resource_besides_their_route() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_api_definitions([
                ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**")),
                ApiDefinition::new("items").item(ApiPredicateItem::regex(r"/item/\d+")),
            ])
            .unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        for path in ["/product/1", "/product/2/reviews", "/item/12", "/item/abc"] {
            let r = c.get(format!("http://{addr}{path}")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
        }
        assert_eq!(stats(&engine, "products").minute_pass, 2, "both product paths are in the group");
        assert_eq!(stats(&engine, "items").minute_pass, 1, "/item/abc does not match the regex");
        assert_eq!(stats(&engine, "/product/{id}").minute_pass, 1, "the route's own resource counts too");
        assert_eq!(stats(&engine, "/item/{id}").minute_pass, 2);
    })
    .await;
}

#[tokio::test]
async fn a_rule_on_an_api_group_limits_every_path_of_the_group_together() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
            .unwrap();
        engine.load_gateway_rules([api_rule("products", 2.0)]).unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let got = statuses(3, || c.get(format!("http://{addr}/product/1"))).await;
        assert_eq!(got, [200, 200, 429]);
        let other = c.get(format!("http://{addr}/product/9/reviews")).send().await.unwrap();
        assert_eq!(other.status(), 429, "the group's paths share its one budget");
        assert_eq!(c.get(format!("http://{addr}/search")).send().await.unwrap().status(), 200, "not in the group");
        assert_eq!(stats(&engine, "products").minute_block, 2);
    })
    .await;
}

#[tokio::test]
async fn a_url_parameter_rule_with_a_regex_limits_only_matching_values_each_on_its_own() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_gateway_rules([GatewayFlowRule::new("/search")
                .count(1.0)
                .param_item(GatewayParamItem::url_param("user").pattern("vip-.+", ParamMatchStrategy::Regex))])
            .unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let url = |user: &str| format!("http://{addr}/search?q=x&user={user}");
        assert_eq!(statuses(2, || c.get(url("vip-1"))).await, [200, 429]);
        assert_eq!(statuses(1, || c.get(url("vip-2"))).await, [200], "each value has its own budget");
        assert_eq!(statuses(5, || c.get(url("bob"))).await, [200; 5], "values that do not match are not limited");
        assert_eq!(statuses(3, || c.get(format!("http://{addr}/search"))).await, [200; 3], "absent: never limited");
    })
    .await;
}

#[tokio::test]
async fn header_cookie_and_host_rules_limit_per_value() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_gateway_rules([
                GatewayFlowRule::new("/product/{id}").count(2.0).param_item(GatewayParamItem::header("X-Tenant")),
                GatewayFlowRule::new("/item/{id}").count(1.0).param_item(GatewayParamItem::cookie("session")),
                GatewayFlowRule::new("/search")
                    .count(1.0)
                    .param_item(GatewayParamItem::host().pattern("shop.", ParamMatchStrategy::Prefix)),
            ])
            .unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let product = |tenant: &str| c.get(format!("http://{addr}/product/1")).header("x-tenant", tenant);
        assert_eq!(statuses(3, || product("acme")).await, [200, 200, 429]);
        assert_eq!(statuses(1, || product("globex")).await, [200]);

        let item = |session: &str| {
            c.get(format!("http://{addr}/item/1")).header("cookie", format!("theme=dark; session={session}"))
        };
        assert_eq!(statuses(2, || item("s1")).await, [200, 429]);
        assert_eq!(statuses(1, || item("s2")).await, [200]);

        let search = |host: &str| c.get(format!("http://{addr}/search")).header("host", host);
        assert_eq!(statuses(2, || search("shop.example")).await, [200, 429], "a prefix pattern matches by prefix");
        assert_eq!(statuses(3, || search("api.example")).await, [200; 3], "another host does not match");
    })
    .await;
}

#[tokio::test]
async fn a_client_ip_rule_believes_forwarded_addresses_only_from_trusted_proxies() {
    bounded(async {
        let rule = || GatewayFlowRule::new("/search").count(1.0).param_item(GatewayParamItem::client_ip());
        // Without trusted proxies a spoofed X-Forwarded-For is ignored: every request is the peer's.
        let (engine, _clock) = engine_at(0);
        engine.load_gateway_rules([rule()]).unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let mut n = 0;
        let mut spoofed = || {
            n += 1;
            c.get(format!("http://{addr}/search")).header("x-forwarded-for", format!("203.0.113.{n}"))
        };
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(spoofed().send().await.unwrap().status().as_u16());
        }
        assert_eq!(got, [200, 429], "the peer 127.0.0.1 is the client");

        // Behind a trusted proxy (loopback), each forwarded client has its own budget.
        let (engine, _clock) = engine_at(0);
        engine.load_gateway_rules([rule()]).unwrap();
        let addr = serve(app(&engine, TrustedProxies::new(["127.0.0.0/8"]).unwrap())).await;
        let from = |ip: &str| c.get(format!("http://{addr}/search")).header("x-forwarded-for", ip);
        assert_eq!(statuses(2, || from("203.0.113.1")).await, [200, 429]);
        assert_eq!(statuses(1, || from("203.0.113.2")).await, [200]);
    })
    .await;
}

#[tokio::test]
async fn burst_adds_to_the_bucket_and_an_interval_of_60_s_refills_only_after_more_than_60_s() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_gateway_rules([GatewayFlowRule::new("/search")
                .count(1.0)
                .burst(2)
                .interval_sec(60)
                .param_item(GatewayParamItem::header("x-user"))])
            .unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let call = || c.get(format!("http://{addr}/search")).header("x-user", "ann");
        assert_eq!(statuses(4, call).await, [200, 200, 200, 429], "count 1 + burst 2");
        clock.advance_millis(60_000);
        assert_eq!(statuses(1, call).await, [429], "exactly 60 s: not yet refilled");
        clock.advance_millis(1);
        assert_eq!(statuses(2, call).await, [200, 429], "past 60 s: one interval's count is back");
    })
    .await;
}

#[tokio::test]
async fn loading_the_users_hot_parameter_rules_keeps_the_gateway_rules_and_their_counters() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_gateway_rules([GatewayFlowRule::new("/search").count(1.0)]).unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let c = client();
        let call = || c.get(format!("http://{addr}/search"));
        assert_eq!(statuses(1, call).await, [200]);
        engine.load_param_flow_rules([ParamFlowRule::new("other", 0).count(5.0)]).unwrap();
        assert_eq!(engine.param_flow_rules().len(), 1, "the user's list holds only the user's rules");
        assert_eq!(statuses(1, call).await, [429], "the gateway's counter was not reset");
        engine.load_param_flow_rules([]).unwrap();
        assert_eq!(statuses(1, call).await, [429], "clearing the user's rules leaves the gateway's");
        engine.load_gateway_rules([]).unwrap();
        assert_eq!(statuses(1, call).await, [200]);
    })
    .await;
}

#[test]
fn an_invalid_gateway_rule_set_changes_nothing_and_names_the_rule() {
    let (engine, _clock) = engine_at(0);
    engine.load_gateway_rules([GatewayFlowRule::new("/search").count(1.0)]).unwrap();
    let bad = GatewayFlowRule::new("/search")
        .count(1.0)
        .param_item(GatewayParamItem::header("x-k").pattern("(", ParamMatchStrategy::Regex));
    let e = engine.load_gateway_rules([GatewayFlowRule::new("/a").count(1.0), bad]).unwrap_err();
    assert_eq!(e.index(), 1, "{e}");
    assert_eq!(engine.gateway_rules(), [GatewayFlowRule::new("/search").count(1.0)]);
}

#[tokio::test]
async fn a_hundred_thousand_distinct_header_values_keep_the_counters_bounded() {
    let (engine, _clock) = engine_at(0);
    engine
        .load_gateway_rules([GatewayFlowRule::new("/search").count(1.0).param_item(GatewayParamItem::header("x-user"))])
        .unwrap();
    let app = app(&engine, TrustedProxies::none());
    for i in 0..100_000u32 {
        let req = axum::http::Request::get("/search")
            .header("x-user", i.to_string())
            .body(axum::body::Body::empty())
            .unwrap();
        let status = app.clone().oneshot(req).await.unwrap().status();
        assert_eq!(status, StatusCode::OK, "value {i} is new");
    }
    let tracked = engine.param_flow_tracked("/search");
    assert_eq!(tracked.len(), 1);
    let (values, cap) = tracked[0];
    assert!(values <= cap && cap < 100_000, "{values} values tracked, cap {cap}");
}

/// The `RateLimit` field's `r` and `t` of the policy named `name` (`"name";r=..;t=..`).
fn remaining_and_reset(r: &reqwest::Response, name: &str) -> Option<(u64, u64)> {
    let field = r.headers().get("ratelimit")?.to_str().ok()?.to_string();
    let item = field.split(',').map(str::trim).find(|i| i.starts_with(&format!("\"{name}\"")))?;
    let param = |k: &str| item.split(';').find_map(|p| p.strip_prefix(&format!("{k}="))?.parse::<u64>().ok());
    Some((param("r")?, param("t")?))
}

fn rate_limited_app(engine: &Sentinel) -> Router {
    Router::new()
        .route("/search", get(|| async { "results" }))
        .route("/product/{id}", get(|| async { "product" }))
        .route_layer(
            SentinelLayer::new(engine)
                .method_prefix(false)
                .gateway(TrustedProxies::none())
                .rate_limit_headers(RateLimitHeaders::new().legacy(true)),
        )
}

#[tokio::test]
async fn ratelimit_fields_count_down_to_zero_and_a_blocked_response_carries_them_with_retry_after() {
    bounded(async {
        let (engine, _clock) = engine_at(100);
        engine.load_flow_rules([FlowRule::new("/search").count(3.0)]).unwrap();
        let addr = serve(rate_limited_app(&engine)).await;
        let c = client();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r = c.get(format!("http://{addr}/search")).send().await.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["ratelimit-policy"], "\"/search\";q=3;w=1");
            seen.push(remaining_and_reset(&r, "/search").expect("a RateLimit field"));
            assert_eq!(r.headers()["x-ratelimit-limit"], "3");
        }
        assert_eq!(seen, [(2, 1), (1, 1), (0, 1)], "remaining counts down; more within the 1 s window");
        let r = c.get(format!("http://{addr}/search")).send().await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(remaining_and_reset(&r, "/search").map(|(rem, _)| rem), Some(0));
        assert!(r.headers().contains_key("retry-after"));
        assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
        assert_eq!(stats(&engine, "/search").minute_pass, 3, "reading the fields spent nothing: exactly 3 admitted");
    })
    .await;
}

#[tokio::test]
async fn a_gateway_rules_bucket_is_a_policy_with_its_interval_and_burst() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_gateway_rules([GatewayFlowRule::new("/product/{id}")
                .count(2.0)
                .burst(1)
                .interval_sec(60)
                .param_item(GatewayParamItem::header("x-user"))])
            .unwrap();
        let addr = serve(rate_limited_app(&engine)).await;
        let c = client();
        let call = || c.get(format!("http://{addr}/product/7")).header("x-user", "ann");
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r = call().send().await.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["ratelimit-policy"], "\"/product/{id}#0\";q=3;w=60");
            seen.push(remaining_and_reset(&r, "/product/{id}#0").unwrap());
            clock.advance_millis(10_000);
        }
        assert_eq!(seen, [(2, 61), (1, 51), (0, 41)], "count + burst, refilled just over 60 s after the first call");
        let r = call().send().await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(remaining_and_reset(&r, "/product/{id}#0"), Some((0, 31)));
        assert_eq!(r.headers()["retry-after"], "31");
        let other = c.get(format!("http://{addr}/product/7")).header("x-user", "bob").send().await.unwrap();
        assert_eq!(remaining_and_reset(&other, "/product/{id}#0").map(|(r, _)| r), Some(2), "bob's own bucket");
    })
    .await;
}

/// A request to `path`, for `oneshot`.
fn request(path: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap()
}

#[tokio::test]
async fn an_api_groups_resource_takes_the_rules_loaded_after_its_first_request() {
    let (engine, _clock) = engine_at(0);
    engine
        .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
        .unwrap();
    let app = app(&engine, TrustedProxies::none());
    assert_eq!(app.clone().oneshot(request("/product/1")).await.unwrap().status(), StatusCode::OK);
    engine.load_gateway_rules([api_rule("products", 1.0)]).unwrap();
    assert_eq!(app.clone().oneshot(request("/product/1")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.clone().oneshot(request("/product/2")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(stats(&engine, "products").minute_pass, 2);
}

#[tokio::test]
async fn an_api_group_past_the_resource_cap_gets_a_resource_of_its_own_once_a_rule_names_it() {
    let engine = Sentinel::builder().max_resources(1).build();
    engine
        .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
        .unwrap();
    let app = app(&engine, TrustedProxies::none());
    // The route's resource takes the one place: the group's calls go to the overflow resource.
    assert_eq!(app.clone().oneshot(request("/product/1")).await.unwrap().status(), StatusCode::OK);
    assert!(engine.cluster_stats("products").is_none_or(|s| s.minute_pass == 0));
    engine.load_gateway_rules([api_rule("products", 0.0)]).unwrap();
    assert_eq!(app.clone().oneshot(request("/product/1")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_route_and_its_api_group_each_limit_the_forwarded_client_and_many_rules_each_read_their_own_value() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
            .unwrap();
        // The client's address is read once per request for both resources: each still counts it.
        engine
            .load_gateway_rules([
                GatewayFlowRule::new("/product/{id}").count(2.0).param_item(GatewayParamItem::client_ip()),
                api_rule("products", 1.0).param_item(GatewayParamItem::client_ip()),
            ])
            .unwrap();
        let addr = serve(app(&engine, TrustedProxies::new(["127.0.0.0/8"]).unwrap())).await;
        let c = client();
        let from = |ip: &str| c.get(format!("http://{addr}/product/1")).header("x-forwarded-for", ip);
        assert_eq!(statuses(2, || from("203.0.113.1")).await, [200, 429], "the group's limit of 1 per client");
        assert_eq!(statuses(2, || from("203.0.113.2")).await, [200, 429], "another client, its own budget");
        assert_eq!(stats(&engine, "/product/{id}").minute_pass, 4, "the route passed all four (2 per client)");

        // Nine rules on one route read nine arguments (more than are kept on the stack): the ninth, by
        // header, limits per value; the eight others never limit.
        let (engine, _clock) = engine_at(0);
        let mut rules: Vec<GatewayFlowRule> = (0..8)
            .map(|i| {
                let item = if i % 2 == 0 { GatewayParamItem::client_ip() } else { GatewayParamItem::host() };
                GatewayFlowRule::new("/search").count(1e9).param_item(item)
            })
            .collect();
        rules.push(GatewayFlowRule::new("/search").count(1.0).param_item(GatewayParamItem::header("x-user")));
        engine.load_gateway_rules(rules).unwrap();
        let addr = serve(app(&engine, TrustedProxies::none())).await;
        let user = |u: &str| c.get(format!("http://{addr}/search")).header("x-user", u);
        assert_eq!(statuses(2, || user("ann")).await, [200, 429]);
        assert_eq!(statuses(2, || user("bob")).await, [200, 429]);
    })
    .await;
}
