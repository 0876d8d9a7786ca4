#!/usr/bin/env bash
# Makes a throwaway PKI for samplerd's TLS tests and benchmarks (never for production: keys are
# unencrypted, CAs live a day). Needs the openssl command.
#   scripts/make_test_certs.sh DIR [SERVER_DIR_NAME]
# Writes into DIR:
#   ca.pem ca.key                the CA that signs everything below
#   SERVER_DIR_NAME/tls.crt, tls.key   samplerd's certificate (DNS:localhost, IP:127.0.0.1,
#                                DNS:samplerd); default SERVER_DIR_NAME: server. A second call
#                                with another name is a rotation's new pair from the same CA.
#   worker-a.pem/.key            a client, SAN DNS:worker-a.llm.svc
#   worker-b.pem/.key            a client, SAN DNS:worker-b.llm.svc
#   expired.pem/.key             a client of the same CA whose validity ended yesterday
#   other-ca.pem, stranger.pem/.key   a client certificate from an unrelated CA
set -euo pipefail
dir=$1
server=${2:-server}
mkdir -p "$dir/$server"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# sign NAME CA_PREFIX SAN DAYS: NAME.pem from NAME.key, signed by CA_PREFIX.pem/.key.
sign() {
  openssl req -new -key "$1.key" -subj "/CN=$(basename "$1")" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days "$4" -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca() {
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$1" -days 1 -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
[[ -f ca.pem ]] || ca ca
key "$server/tls.key"
sign "$server/tls" ca "DNS:localhost,IP:127.0.0.1,DNS:samplerd" 1
mv "$server/tls.pem" "$server/tls.crt"
if [[ ! -f worker-a.pem ]]; then
  for client in worker-a worker-b; do key "$client.key"; sign "$client" ca "DNS:$client.llm.svc" 1; done
  key expired.key; sign expired ca "DNS:worker-a.llm.svc" -1
  ca other-ca; key stranger.key; sign stranger other-ca "DNS:worker-a.llm.svc" 1
fi
