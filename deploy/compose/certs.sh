#!/bin/sh
# The compose file's `certs` service (run as root, once per `up`; idempotent): makes the
# cluster CA and every certificate in the `ca` volume, keeping what is already there, then
# hands each volume only what its containers need:
#   certs   ca.pem, coord-N and node-N certificates and keys (coordinators and agents)
#   admin   ca.pem, the admin's certificate and key, client.toml naming coord-N:7401 (init)
#   /client the host's client config: ca.pem, admin.pem, admin-key.pem and client.toml
#           naming the coordinators' published ports on $QUOTIENT_PUBLISH_ADDRESS
# and prints the host's client.toml.
set -eu
ca=/ca
owner_uid=10001
publish="${QUOTIENT_PUBLISH_ADDRESS:-127.0.0.1}"

if [ ! -f "$ca/ca.pem" ]; then
    quotient certs init --dir "$ca"
fi
issue() { # ROLE NAME [--san HOST]...
    role="$1"
    name="$2"
    shift 2
    [ -f "$ca/$name.pem" ] || quotient certs issue --dir "$ca" --role "$role" --name "$name" "$@"
}
# localhost and 127.0.0.1 are always in a coordinator's certificate: the host's CLI reaches
# the coordinators through ports published on 127.0.0.1.
for i in 1 2 3; do issue coordinator "coord-$i" --san "coord-$i"; done
for i in 1 2 3; do issue agent "node-$i"; done
issue admin admin

cp "$ca/ca.pem" /certs/
for name in coord-1 coord-2 coord-3 node-1 node-2 node-3; do
    cp "$ca/$name.pem" "$ca/$name-key.pem" /certs/
done
cp "$ca/ca.pem" "$ca/admin.pem" "$ca/admin-key.pem" /admin/
cat >/admin/client.toml <<TOML
coordinators = ["coord-1:7401", "coord-2:7401", "coord-3:7401"]
ca = "ca.pem"
cert = "admin.pem"
key = "admin-key.pem"
TOML
chown -R "$owner_uid:$owner_uid" /certs /admin
chmod 0600 /certs/*-key.pem /admin/admin-key.pem

# The host's copy belongs to whoever owns the bind-mounted folder (mkdir it before `up`),
# or to QUOTIENT_CLIENT_OWNER (UID:GID).
client_owner="${QUOTIENT_CLIENT_OWNER:-$(stat -c %u:%g /client)}"
cp "$ca/ca.pem" "$ca/admin.pem" "$ca/admin-key.pem" /client/
cat >/client/client.toml <<TOML
# The host's client config of the compose cluster: export QUOTIENT_CONFIG=<this file>
coordinators = ["$publish:${QUOTIENT_PORT_1:-17401}", "$publish:${QUOTIENT_PORT_2:-17402}", "$publish:${QUOTIENT_PORT_3:-17403}"]
ca = "ca.pem"
cert = "admin.pem"
key = "admin-key.pem"
TOML
chown "$client_owner" /client/ca.pem /client/admin.pem /client/admin-key.pem /client/client.toml
chmod 0600 /client/admin-key.pem
echo "certificates ready; the host's client config (the folder QUOTIENT_CLIENT_DIR, ./client by default):"
cat /client/client.toml
