//! Certificates made by the test (with the `openssl` command) in a temp dir,
//! and a TLS-enabled `redis-server` with an ACL user confined to the crate's
//! key namespace.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::redis::RedisServer;

/// A private CA, a server certificate for `localhost` and `127.0.0.1`
/// signed by it, a client certificate signed by it, and a second CA that
/// signed nothing (to be trusted by mistake).
pub struct Certs {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the openssl command is installed");
    assert!(status.success(), "openssl {args:?}");
}

impl Certs {
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "stampede-guard-tls-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        for ca in ["ca", "other-ca"] {
            let key = format!("{ca}.key");
            let crt = format!("{ca}.crt");
            let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
            args.extend(ec);
            args.extend([
                "-keyout",
                &key,
                "-out",
                &crt,
                "-subj",
                "/CN=stampede-guard test CA",
            ]);
            openssl(&dir, &args);
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write ext");
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("write ext");
        for (name, cn) in [("server", "localhost"), ("client", "stampede-guard")] {
            let key = format!("{name}.key");
            let csr = format!("{name}.csr");
            let crt = format!("{name}.crt");
            let ext = format!("{name}.ext");
            let subj = format!("/CN={cn}");
            let mut args = vec!["req", "-nodes"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(&dir, &args);
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &crt,
                    "-extfile",
                    &ext,
                ],
            );
        }
        Certs { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn pem(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("read pem")
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The ACL rules of a user that can run this crate and nothing else: its
/// scripts, the commands they call, its key prefix and its channel.
pub const ACL_RULES: &[&str] = &[
    "~sg:*",
    "&sg:*",
    "+hello",
    "+auth",
    "+ping",
    "+subscribe",
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+strlen",
    "+getrange",
    "+set",
    "+del",
    "+pttl",
    "+pexpire",
    "+hget",
    "+hset",
    "+hdel",
    "+hincrby",
    "+hexists",
    "+exists",
    "+incr",
    "+publish",
    "+time",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrank",
    "+zscore",
    "+zremrangebyscore",
    "+sadd",
    "+smembers",
    "+role",
    "+wait",
    "+info",
];

/// A redis-server that speaks TLS on `tls_port` (the plain port stays open,
/// for the test's own admin commands) and has the user `app`, password
/// `app-secret`, limited to [`ACL_RULES`].
pub struct TlsRedis {
    pub server: RedisServer,
    pub tls_port: u16,
}

impl TlsRedis {
    pub fn start(certs: &Certs, client_certs_required: bool) -> Self {
        // As an application must: the crate never picks rustls's provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls_port = free_port();
        let port = tls_port.to_string();
        let cert = certs.path("server.crt");
        let key = certs.path("server.key");
        let ca = certs.path("ca.crt");
        let mut args: Vec<String> = vec![
            "--tls-port".into(),
            port,
            "--tls-cert-file".into(),
            cert.display().to_string(),
            "--tls-key-file".into(),
            key.display().to_string(),
            "--tls-ca-cert-file".into(),
            ca.display().to_string(),
            "--tls-auth-clients".into(),
            if client_certs_required { "yes" } else { "no" }.into(),
            "--user".into(),
            "app".into(),
            "on".into(),
            ">app-secret".into(),
        ];
        args.extend(ACL_RULES.iter().map(|r| r.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisServer::start_with(&refs);
        TlsRedis { server, tls_port }
    }

    /// The URL for the confined user.
    pub fn url(&self, password: &str) -> String {
        format!("rediss://app:{password}@localhost:{}/", self.tls_port)
    }
}
