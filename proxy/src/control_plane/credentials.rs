//! The headers every control-plane call carries (WIRE.md §3, §7):
//! `authorization: Bearer <token>` with the token read again for every call
//! (the kubelet rotates projected tokens), `clusterid`, and the extras of
//! `CA_HEADER_*` / `XDS_HEADER_*`.
//!
//! Which token source and extras apply is decided by the config module; this
//! only turns them into header values.

use std::fmt;
use std::path::PathBuf;

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap, MetadataValue};

use super::ControlPlaneError;

/// A token given literally (`AUTH_TOKEN` naming no file). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct LiteralToken(String);

impl LiteralToken {
    /// Wraps the token text.
    pub fn new(token: String) -> Self {
        LiteralToken(token)
    }
}

impl fmt::Debug for LiteralToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LiteralToken(<redacted>)")
    }
}

/// Where the Bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file read again for every call.
    File(PathBuf),
    /// A fixed token.
    Literal(LiteralToken),
    /// No token: calls carry no `authorization` header.
    None,
}

/// Extra headers from `<PREFIX>_<NAME>=<value>` settings, validated once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraHeaders(Vec<(AsciiMetadataKey, AsciiMetadataValue)>);

impl ExtraHeaders {
    /// Validates `(name, value)` pairs; the error names the first bad one
    /// as `what` plus its name.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        what: &str,
    ) -> Result<ExtraHeaders, ControlPlaneError> {
        pairs
            .into_iter()
            .map(|(name, value)| {
                let invalid = || ControlPlaneError::InvalidHeader(format!("{what}{name}"));
                let key = name.parse::<AsciiMetadataKey>().map_err(|_| invalid())?;
                let value = value.parse::<AsciiMetadataValue>().map_err(|_| invalid())?;
                Ok((key, value))
            })
            .collect::<Result<_, _>>()
            .map(ExtraHeaders)
    }

    /// The header names, for logs.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(name, _)| name.as_str())
    }
}

/// The credential headers of one service.
#[derive(Clone)]
pub struct Credentials {
    token: TokenSource,
    cluster_id: Option<AsciiMetadataValue>,
    extra: ExtraHeaders,
}

impl Credentials {
    /// `cluster_id` is sent as `clusterid` when given; the CA always sends
    /// it, xDS only together with a token (WIRE.md §7).
    pub fn new(
        token: TokenSource,
        cluster_id: Option<&str>,
        extra: ExtraHeaders,
    ) -> Result<Credentials, ControlPlaneError> {
        let cluster_id = cluster_id
            .map(|id| {
                id.parse::<AsciiMetadataValue>()
                    .map_err(|_| ControlPlaneError::InvalidHeader(format!("clusterid {id:?}")))
            })
            .transpose()?;
        Ok(Credentials {
            token,
            cluster_id,
            extra,
        })
    }

    /// Whether a token is sent.
    pub fn has_token(&self) -> bool {
        self.token != TokenSource::None
    }

    /// Puts the headers on a request, reading the token file as it is now.
    pub async fn apply(&self, metadata: &mut MetadataMap) -> Result<(), ControlPlaneError> {
        if let Some(authorization) = self.authorization().await? {
            metadata.insert("authorization", authorization);
        }
        if let Some(cluster_id) = &self.cluster_id {
            metadata.insert("clusterid", cluster_id.clone());
        }
        for (name, value) in &self.extra.0 {
            metadata.insert(name.clone(), value.clone());
        }
        Ok(())
    }

    /// `Bearer <token>`, marked sensitive so it never shows in debug output.
    async fn authorization(&self) -> Result<Option<AsciiMetadataValue>, ControlPlaneError> {
        let (token, origin) = match &self.token {
            TokenSource::None => return Ok(None),
            TokenSource::Literal(LiteralToken(token)) => (token.clone(), "AUTH_TOKEN".to_owned()),
            TokenSource::File(path) => {
                let token = tokio::fs::read_to_string(path).await.map_err(|source| {
                    ControlPlaneError::TokenRead {
                        path: path.clone(),
                        source,
                    }
                })?;
                (token, path.display().to_string())
            }
        };
        let mut value = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| ControlPlaneError::InvalidToken(origin))?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token)
            .field("cluster_id", &self.cluster_id)
            .field("extra", &self.extra.names().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn headers(credentials: &Credentials) -> Vec<(String, String)> {
        let mut metadata = MetadataMap::new();
        credentials.apply(&mut metadata).await.unwrap();
        let mut pairs: Vec<_> = metadata
            .into_headers()
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect();
        pairs.sort();
        pairs
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[tokio::test]
    async fn the_token_file_is_read_on_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let extra = ExtraHeaders::parse([("x-extra", "1")], "XDS_HEADER_").unwrap();
        let credentials =
            Credentials::new(TokenSource::File(path.clone()), Some("east"), extra).unwrap();
        assert_eq!(
            headers(&credentials).await,
            [
                pair("authorization", "Bearer first"),
                pair("clusterid", "east"),
                pair("x-extra", "1")
            ]
        );
        std::fs::write(&path, "second").unwrap();
        assert_eq!(
            headers(&credentials).await[0],
            pair("authorization", "Bearer second")
        );
        std::fs::remove_file(&path).unwrap();
        let mut metadata = MetadataMap::new();
        let error = credentials.apply(&mut metadata).await.unwrap_err();
        assert!(matches!(error, ControlPlaneError::TokenRead { .. }));
    }

    #[tokio::test]
    async fn literal_and_absent_tokens() {
        let literal = TokenSource::Literal(LiteralToken::new("abc".to_owned()));
        assert!(!format!("{literal:?}").contains("abc"));
        let credentials = Credentials::new(literal, None, ExtraHeaders::default()).unwrap();
        assert_eq!(
            headers(&credentials).await,
            [pair("authorization", "Bearer abc")]
        );
        let none = Credentials::new(TokenSource::None, None, ExtraHeaders::default()).unwrap();
        assert!(!none.has_token());
        assert!(headers(&none).await.is_empty());
    }

    #[test]
    fn bad_headers_are_named() {
        let error = ExtraHeaders::parse([("bad name", "1")], "XDS_HEADER_").unwrap_err();
        assert_eq!(
            error.to_string(),
            "XDS_HEADER_bad name is not a valid header"
        );
        assert!(ExtraHeaders::parse([("ok", "line\nbreak")], "X_").is_err());
        assert!(
            Credentials::new(TokenSource::None, Some("a\nb"), ExtraHeaders::default()).is_err()
        );
    }
}
