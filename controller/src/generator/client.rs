//! The HTTPS adapter of one `BootstrapGenerator`: POSTs a request, reads at most
//! `spec.maxResponseBytes` of the answer within `spec.timeoutSeconds`, and hands the bytes to
//! the protocol module (`render::generator`), which decides whether they are a valid part.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crd_types::GeneratorSpec;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use render::generator::{GeneratedPart, Request, ResponseError, parse_response};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Why a call gave no part. Messages name the cause in words and never quote contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No connection (refused, no route, DNS, TLS handshake).
    #[error("cannot reach it: {0}")]
    Unreachable(String),
    /// No whole answer in time.
    #[error("no answer within {0:?} (spec.timeoutSeconds)")]
    Timeout(Duration),
    /// An HTTP status other than 200.
    #[error("it answered HTTP {0}")]
    Status(u16),
    /// The body: too large, malformed, or a refusal.
    #[error("{0}")]
    Response(#[from] ResponseError),
}

impl CallError {
    /// The `result` label of `bootplate_generator_requests_total`.
    pub fn result(&self) -> &'static str {
        match self {
            CallError::Unreachable(_) => "unreachable",
            CallError::Timeout(_) => "timeout",
            CallError::Status(_) => "http_error",
            CallError::Response(ResponseError::TooLarge { .. }) => "too_large",
            CallError::Response(ResponseError::Malformed(_)) => "invalid",
            CallError::Response(ResponseError::Refused(_)) => "refused",
        }
    }
}

/// A client for one generator's endpoint, with its limits.
pub struct GeneratorClient {
    endpoint: http::Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
    max_bytes: u64,
}

/// The client certificate bootplate presents to generators (`--generator-client-cert-dir`), so
/// a generator can tell bootplate's calls from anyone else's.
pub type ClientCert = Arc<dyn rustls::client::ResolvesClientCert>;

impl GeneratorClient {
    /// A client for `spec` that presents no client certificate; Err names the field that is
    /// wrong (URL, CA bundle).
    pub fn new(spec: &GeneratorSpec) -> Result<Self, String> {
        Self::with_client_cert(spec, None)
    }

    /// A client for `spec` that presents `client_cert` when the generator asks for one.
    pub fn with_client_cert(
        spec: &GeneratorSpec,
        client_cert: Option<ClientCert>,
    ) -> Result<Self, String> {
        let endpoint: http::Uri = spec
            .client_config
            .endpoint()?
            .parse()
            .map_err(|e| format!("spec.clientConfig: not a URL: {e}"))?;
        let roots = roots(spec.client_config.ca_bundle.as_deref())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_root_certificates(roots);
        let tls = match client_cert {
            Some(cert) => builder.with_client_cert_resolver(cert),
            None => builder.with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Ok(GeneratorClient {
            endpoint,
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout: spec.timeout(),
            max_bytes: spec.max_response_bytes(),
        })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> String {
        self.endpoint.to_string()
    }

    /// Sends `request` and reads the answer: a validated part, or why not.
    pub async fn call(&self, request: &Request) -> Result<GeneratedPart, CallError> {
        let body = serde_json::to_vec(request).expect("a request always serializes");
        let exchange = async {
            let http_request = http::Request::post(self.endpoint.clone())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json")
                .body(Full::new(Bytes::from(body)))
                .expect("a valid request");
            let response = self
                .client
                .request(http_request)
                .await
                .map_err(|e| CallError::Unreachable(cause(&e)))?;
            if response.status() != http::StatusCode::OK {
                return Err(CallError::Status(response.status().as_u16()));
            }
            // Limited stops reading at the limit: a 50 MiB answer costs at most the limit.
            let limit = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
            let bytes = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        CallError::Response(ResponseError::TooLarge {
                            limit: self.max_bytes,
                        })
                    } else {
                        CallError::Unreachable(format!("the answer broke off: {e}"))
                    }
                })?
                .to_bytes();
            Ok(parse_response(&bytes, self.max_bytes)?)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout(self.timeout))?
    }
}

/// The innermost cause of a client error ("Connection refused (os error 111)"), which the
/// outer ones ("client error (Connect)") only wrap.
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

/// The trusted roots: the PEM certificates of `ca_bundle`, or the system's.
pub fn roots(ca_bundle: Option<&str>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_bundle {
        Some(pem) => {
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(pem.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| {
                        format!("spec.clientConfig.caBundle: not PEM certificates: {e}")
                    })?;
            if certs.is_empty() {
                return Err("spec.clientConfig.caBundle: holds no PEM certificate".to_owned());
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("spec.clientConfig.caBundle: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_bundle_must_hold_certificates() {
        assert!(roots(Some("not pem")).unwrap_err().contains("caBundle"));
        let ca = crate::pki::generate_ca("generator CA").unwrap();
        assert_eq!(roots(Some(&ca.cert)).unwrap().len(), 1);
    }

    #[test]
    fn results_are_bounded_labels() {
        let errors = [
            CallError::Unreachable("x".into()),
            CallError::Timeout(Duration::from_secs(1)),
            CallError::Status(500),
            CallError::Response(ResponseError::TooLarge { limit: 1 }),
            CallError::Response(ResponseError::Malformed("x".into())),
            CallError::Response(ResponseError::Refused("x".into())),
        ];
        let labels: Vec<&str> = errors.iter().map(CallError::result).collect();
        assert_eq!(
            labels,
            [
                "unreachable",
                "timeout",
                "http_error",
                "too_large",
                "invalid",
                "refused"
            ]
        );
    }
}
