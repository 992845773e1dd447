//! The admin server ([`monarch_admin`]) bound for Python: `AdminConfig` and
//! `AdminServer`. The server runs on the extension's tokio runtime, so it answers while
//! the interpreter is busy. It serves this process's live job (`serve_live`, over
//! [`LiveSource`]) or a recorded one (`serve_recorded`).

use std::net::SocketAddr;
use std::sync::Arc;

use monarch_admin::LiveSource;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::agent::PyProcAgent;
use crate::runtime::{check_may_block, runtime};

/// How an `AdminServer` listens and whom it lets in.
#[pyclass(module = "monarch._rust_bindings", name = "AdminConfig")]
#[derive(Debug, Clone)]
pub struct PyAdminConfig {
    /// The address to listen on, `host:port`; port 0 picks a free one.
    #[pyo3(get, set)]
    pub bind: String,
    /// Host names accepted in `Host`/`Origin` besides the local ones.
    #[pyo3(get, set)]
    pub allowed_hosts: Vec<String>,
    /// Whether the action routes (killing a proc) are enabled.
    #[pyo3(get, set)]
    pub actions: bool,
    /// A PEM certificate chain: with `tls_key`, the server speaks HTTPS.
    #[pyo3(get, set)]
    pub tls_cert: Option<String>,
    /// The PEM private key of `tls_cert`.
    #[pyo3(get, set)]
    pub tls_key: Option<String>,
    /// The access token; `None` makes a random one.
    #[pyo3(get, set)]
    pub token: Option<String>,
}

#[pymethods]
impl PyAdminConfig {
    #[new]
    #[pyo3(signature = (bind = "127.0.0.1:0".to_string(), allowed_hosts = Vec::new(), actions = false, tls_cert = None, tls_key = None, token = None))]
    fn new(
        bind: String,
        allowed_hosts: Vec<String>,
        actions: bool,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        token: Option<String>,
    ) -> Self {
        PyAdminConfig {
            bind,
            allowed_hosts,
            actions,
            tls_cert,
            tls_key,
            token,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "AdminConfig(bind={:?}, allowed_hosts={:?}, actions={}, tls={})",
            self.bind,
            self.allowed_hosts,
            if self.actions { "True" } else { "False" },
            if self.tls_cert.is_some() {
                "True"
            } else {
                "False"
            },
        )
    }
}

impl PyAdminConfig {
    /// The Rust configuration, or a `ValueError` saying what is wrong.
    fn to_config(&self) -> PyResult<monarch_admin::AdminConfig> {
        let bind: SocketAddr = self.bind.parse().map_err(|e| {
            PyValueError::new_err(format!(
                "AdminConfig.bind={:?} is not an address ({e}); expected host:port with an IP \
                 address, such as \"127.0.0.1:0\" (port 0 picks a free port)",
                self.bind
            ))
        })?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "AdminConfig has only one of tls_cert and tls_key; expected both (PEM \
                     certificate chain and its private key) or neither; set the other one",
                ))
            }
        };
        Ok(monarch_admin::AdminConfig {
            bind,
            allowed_hosts: self.allowed_hosts.clone(),
            actions: self.actions,
            tls,
            token: self.token.clone(),
        })
    }
}

/// A running admin server.
#[pyclass(module = "monarch._rust_bindings", name = "AdminServer", frozen)]
#[derive(Debug)]
pub struct PyAdminServer {
    server: Arc<monarch_admin::AdminServer>,
}

fn start_error(e: monarch_admin::AdminError) -> PyErr {
    match e {
        monarch_admin::AdminError::Bind { .. } => PyOSError::new_err(e.to_string()),
        e => PyValueError::new_err(e.to_string()),
    }
}

#[pymethods]
impl PyAdminServer {
    /// Serves the recorded job in the JSON file at `path` (keys summary, snapshot,
    /// events, logs, series).
    #[staticmethod]
    #[pyo3(signature = (path, config = None))]
    fn serve_recorded(
        path: &str,
        config: Option<PyRef<'_, PyAdminConfig>>,
    ) -> PyResult<PyAdminServer> {
        let config = match config {
            Some(c) => c.to_config()?,
            None => monarch_admin::AdminConfig::default(),
        };
        let source = monarch_admin::RecordedSource::from_file(path.as_ref())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let server =
            monarch_admin::AdminServer::start_on(runtime()?.handle(), config, Arc::new(source))
                .map_err(start_error)?;
        Ok(PyAdminServer {
            server: Arc::new(server),
        })
    }

    /// Serves this process's live job, as seen by `agent` (the process's mesh agent);
    /// `program` is what the summary calls the program (the script's name).
    #[staticmethod]
    #[pyo3(signature = (agent, config = None, program = None))]
    fn serve_live(
        agent: PyRef<'_, PyProcAgent>,
        config: Option<PyRef<'_, PyAdminConfig>>,
        program: Option<String>,
    ) -> PyResult<PyAdminServer> {
        let config = match config {
            Some(c) => c.to_config()?,
            None => monarch_admin::AdminConfig::default(),
        };
        let rt = runtime()?;
        let source = {
            let _entered = rt.enter();
            LiveSource::new(agent.agent().clone(), program.unwrap_or_default())
        };
        let server = monarch_admin::AdminServer::start_on(rt.handle(), config, Arc::new(source))
            .map_err(start_error)?;
        Ok(PyAdminServer {
            server: Arc::new(server),
        })
    }

    /// The URL to give users: the base URL with `?token=`.
    #[getter]
    fn url(&self) -> String {
        self.server.url()
    }

    /// The base URL, without the token.
    #[getter]
    fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// The access token.
    #[getter]
    fn token(&self) -> String {
        self.server.token().to_string()
    }

    /// The port the server listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.server.local_addr().port()
    }

    /// Stops the server: no new connections, event streams end, open requests get a
    /// few seconds to finish. Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        check_may_block("AdminServer.stop()")?;
        let server = Arc::clone(&self.server);
        let rt = runtime()?;
        py.detach(|| rt.block_on(server.shutdown()));
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("AdminServer({})", self.server.base_url())
    }
}

/// Adds `AdminConfig` and `AdminServer` to the module.
///
/// # Errors
///
/// Fails if adding a class to the module fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAdminConfig>()?;
    m.add_class::<PyAdminServer>()?;
    Ok(())
}
