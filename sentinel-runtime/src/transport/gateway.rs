//! The dashboard's gateway commands (Java's `sentinel-api-gateway-adapter-common` command handlers):
//! `gateway/getApiDefinitions`, `gateway/updateApiDefinitions`, `gateway/getRules`, `gateway/updateRules`,
//! in Java's JSON ([`web::gateway::json`](crate::web::gateway::json)).
//!
//! `data` is decoded once (Java decodes it a second time, which turns a `+` of a regular expression into a
//! space); an invalid push is answered `400` with the reason and changes nothing (Java drops invalid rules
//! and answers `success`).

use super::commands::written_back;
use super::handler::{Center, CommandError, Params, Reply};
use super::write_back::Stored;
use crate::datasource::GatewayDocuments;
use crate::web::gateway::json;

/// `data`, or the error that says what it should hold.
fn data<'p>(p: &'p Params, what: &str) -> Result<&'p str, CommandError> {
    p.0.get("data")
        .map(String::as_str)
        .ok_or_else(|| CommandError(format!("`data` is required: a JSON array of {what} (`[]` removes them all)")))
}

pub(crate) fn get_api_definitions(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    Ok(Reply::json_text(json::api_definitions_to_json(&c.engine.api_definitions())))
}

pub(crate) fn get_rules(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    Ok(Reply::json_text(json::rules_to_json(&c.engine.gateway_rules())))
}

pub(crate) fn update_api_definitions(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let definitions = json::api_definitions_from_json(data(p, "API definitions")?)
        .map_err(|e| CommandError(format!("invalid API definitions in `data`: {e}")))?;
    let _serial = c.writes.lock().unwrap_or_else(|e| e.into_inner());
    c.engine.load_api_definitions(definitions).map_err(|e| CommandError(e.to_string()))?;
    tracing::info!("API definitions pushed through the command center are in force");
    let pushed = GatewayDocuments { api_definitions: Some(c.engine.api_definitions()), rules: None };
    Ok(written_back(c, Stored::ApiDefinitions, Box::new(move |source| source.write_gateway(&pushed))))
}

pub(crate) fn update_rules(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let rules = json::rules_from_json(data(p, "gateway flow rules")?)
        .map_err(|e| CommandError(format!("invalid gateway flow rules in `data`: {e}")))?;
    let _serial = c.writes.lock().unwrap_or_else(|e| e.into_inner());
    c.engine.load_gateway_rules(rules).map_err(|e| CommandError(e.to_string()))?;
    tracing::info!("gateway flow rules pushed through the command center are in force");
    let pushed = GatewayDocuments { rules: Some(c.engine.gateway_rules()), api_definitions: None };
    Ok(written_back(c, Stored::GatewayRules, Box::new(move |source| source.write_gateway(&pushed))))
}
