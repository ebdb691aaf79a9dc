#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Makes a CA and the certificates ironguard's gRPC API needs, with openssl only (docs/operations.md,
# "Certificates and credentials"):
#
#   scripts/make-certs.sh DIR ca                        # DIR/ca.pem, DIR/ca.key (kept by whoever issues)
#   scripts/make-certs.sh DIR server NAME [SAN...]      # the control plane: DIR/NAME.pem/.key, serverAuth;
#                                                       #   SANs like DNS:cp-2.example or IP:10.0.0.5
#   scripts/make-certs.sh DIR client NAME               # an agent (NAME = its [agent] id) or an operator
#                                                       #   (NAME listed in [grpc] operator_names): clientAuth
#
# Keys are P-256 ECDSA, written with mode 0600. Certificates last CERT_DAYS days (default 825). The name is the
# certificate's DNS subject alternative name and its CN; the control plane reads the SAN.
set -euo pipefail
umask 077
dir=${1:?usage: make-certs.sh DIR ca|server|client [NAME] [SAN...]}
kind=${2:?usage: make-certs.sh DIR ca|server|client [NAME] [SAN...]}
days=${CERT_DAYS:-825}
mkdir -p "$dir"
cd "$dir"

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

case "$kind" in
  ca)
    [ -e ca.key ] && { echo "make-certs.sh: $dir/ca.key exists; not replacing a CA" >&2; exit 1; }
    newkey ca.key
    openssl req -x509 -new -key ca.key -days 3650 -subj "/CN=ironguard CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem
    chmod 0644 ca.pem
    echo "$dir/ca.pem (and its key $dir/ca.key: keep it off the servers)"
    ;;
  server | client)
    name=${3:?make-certs.sh: $kind needs a NAME}
    shift 3
    case "$name" in */* | .* | "") echo "make-certs.sh: bad name $name" >&2; exit 1 ;; esac
    [ -e ca.key ] || { echo "make-certs.sh: no CA in $dir (run: make-certs.sh $dir ca)" >&2; exit 1; }
    san="DNS:$name"
    for extra in "$@"; do san="$san,$extra"; done
    eku=clientAuth
    [ "$kind" = server ] && eku=serverAuth
    newkey "$name.key"
    openssl req -new -key "$name.key" -subj "/CN=$name" -out "$name.csr"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -out "$name.pem" \
      -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=%s\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' "$san" "$eku") \
      2>/dev/null
    rm -f "$name.csr"
    chmod 0644 "$name.pem"
    echo "$dir/$name.pem $dir/$name.key ($kind, $san)"
    ;;
  *)
    echo "make-certs.sh: unknown kind $kind (ca, server or client)" >&2
    exit 1
    ;;
esac
