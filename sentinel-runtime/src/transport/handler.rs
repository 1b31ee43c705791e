//! What every command handler is given and gives back: the [`Center`] it runs on and its [`Params`], a
//! [`Reply`] or a [`CommandError`]; and [`Command`], one row of the command table (in
//! [`transport`](super)). The handlers (`commands`, `cluster`, `console`) import this file, and the table
//! imports them: none of them imports another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::breakers::Transitions;
use super::history::History;
use crate::datasource::WritableDataSource;
use crate::Sentinel;

/// The Sentinel version the command center speaks (the dashboard uses it to choose how to call).
pub(crate) const PROTOCOL_VERSION: &str = "1.8.9";

/// The version reported to the dashboard (`v`) and by the `version` command: Java's protocol version, then
/// ours (the dashboard ignores what follows the `-`).
pub(crate) fn version() -> String {
    format!("{PROTOCOL_VERSION}-sentinel-rs-{}", env!("CARGO_PKG_VERSION"))
}

/// What the machine reports about itself (heartbeats, `basicInfo`).
#[derive(Clone, Debug)]
pub(crate) struct MachineInfo {
    pub(crate) app: String,
    pub(crate) app_type: u8,
    pub(crate) hostname: String,
    pub(crate) ip: String,
    pub(crate) port: u16,
}

/// The state commands run on.
pub(crate) struct Center {
    pub(crate) engine: Sentinel,
    pub(crate) history: History,
    pub(crate) transitions: Arc<Transitions>,
    pub(crate) source: Option<Arc<dyn WritableDataSource>>,
    /// The writer of `source`, when there is one.
    pub(crate) write_back: Option<super::write_back::WriteBack>,
    pub(crate) machine: MachineInfo,
    /// Serializes rule pushes, so that what is in force and what is written back are the same push.
    pub(crate) writes: Mutex<()>,
}

/// A command's parameters: the query string and the form body, each URL-decoded once.
#[derive(Debug, Default)]
pub(crate) struct Params(pub(crate) HashMap<String, String>);

impl Params {
    /// Parses `k=v&...` (form encoding: `+` is a space), later keys replacing earlier ones, as Java does.
    pub(crate) fn add_form(&mut self, text: &str) {
        for (k, v) in form_urlencoded::parse(text.as_bytes()) {
            self.0.insert(k.into_owned(), v.into_owned());
        }
    }

    /// A parameter, if present and not blank.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str()).filter(|v| !v.trim().is_empty())
    }

    /// A number parameter, if present and not blank; an error that names it when it does not parse.
    pub(crate) fn number<T: std::str::FromStr>(&self, key: &str, what: &str) -> Result<Option<T>, CommandError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                CommandError(format!("`{key}` must be {what}, not `{}`", v.chars().take(40).collect::<String>()))
            }),
        }
    }
}

/// A successful answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) body: String,
    pub(crate) json: bool,
    /// Why a write-back failed (the rules are in force): sent as `X-Sentinel-Write-Error`.
    pub(crate) write_error: Option<String>,
}

impl Reply {
    pub(crate) fn text(body: impl Into<String>) -> Self {
        Reply { body: body.into(), json: false, write_error: None }
    }
    pub(crate) fn json(value: &impl Serialize) -> Result<Self, CommandError> {
        let body =
            serde_json::to_string(value).map_err(|e| CommandError(format!("could not encode the answer: {e}")))?;
        Ok(Reply { body, json: true, write_error: None })
    }
    /// A JSON answer already encoded.
    pub(crate) fn json_text(body: String) -> Self {
        Reply { body, json: true, write_error: None }
    }
}

/// A command failed: answered `400` with this message (nothing was changed).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CommandError(pub(crate) String);

pub(crate) type Handler = fn(&Center, &Params) -> Result<Reply, CommandError>;

/// One command.
pub(crate) struct Command {
    /// Its name: the request path without the leading `/`.
    pub(crate) name: &'static str,
    /// What it does and what it takes (the `api` command lists it).
    pub(crate) desc: &'static str,
    /// Whether it changes the application (writes need the token, when one is set).
    pub(crate) write: bool,
    pub(crate) run: Handler,
}
