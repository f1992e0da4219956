//! `ztunnel-ca`: the mesh certificate authority.

fn main() {
    ztunnel_certs::tls::install_provider();
}
