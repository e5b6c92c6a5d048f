//! The `--endpoint` address: `unix:///path`, `unix://relative` (KubeVirt's form, rooted at `/`),
//! a plain path, or `tcp://host:port`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the driver listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP `host:port` (port 0 picks a free one).
    Tcp(String),
}

/// An endpoint string that cannot be understood.
#[derive(Debug, thiserror::Error)]
#[error("invalid endpoint {0:?}: expected unix:///path, a path, or tcp://host:port")]
pub struct EndpointError(pub String);

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(EndpointError(s.into()));
            }
            let path = if rest.starts_with('/') {
                PathBuf::from(rest)
            } else {
                PathBuf::from("/").join(rest)
            };
            return Ok(Endpoint::Unix(path));
        }
        if let Some(rest) = s.strip_prefix("tcp://") {
            if rest
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(EndpointError(s.into()));
            }
            return Ok(Endpoint::Tcp(rest.to_owned()));
        }
        if s.is_empty() || s.contains("://") {
            return Err(EndpointError(s.into()));
        }
        Ok(Endpoint::Unix(PathBuf::from(s)))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) if p.is_absolute() => write!(f, "unix://{}", p.display()),
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            "unix:///csi/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/csi/csi.sock".into())
        );
        assert_eq!(
            "unix://tmp/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/tmp/csi.sock".into())
        );
        assert_eq!(
            "/run/x.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/x.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:0".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:0".into())
        );
        assert_eq!(
            "tcp://[::1]:10000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("[::1]:10000".into())
        );
        for bad in ["", "unix://", "tcp://nohost", "tcp://:1", "http://x:1", "tcp://h:99999"] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
        assert_eq!(Endpoint::Unix("/a/b".into()).to_string(), "unix:///a/b");
    }
}
