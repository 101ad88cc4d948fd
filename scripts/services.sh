#!/usr/bin/env bash
# Starts the broker servers the tests talk to, unless they already answer, all on loopback:
#   Redis 127.0.0.1:6379, NATS with JetStream 127.0.0.1:4222, RabbitMQ 127.0.0.1:5672 (guest/guest),
#   Mosquitto 127.0.0.1:1883 (anonymous), Kafka 127.0.0.1:9092 (scripts/kafka.sh).
# The first four come from Debian's packages, installed when absent; there is no systemd, so each
# daemon is started directly. Running it again with everything up only prints.
# A broker with an adapter folder keeps its server recipe there, `adapters/<name>/server.sh`
# (`server_port` and `start_server`; optionally `server_answers`, a check that what listens
# speaks the protocol, and `stop_server`, to replace a server that listens but does not answer),
# found by the loop below; the rest are recipes here until their adapters land.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

say() { echo "services: $*"; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # port [seconds]
  local tenths=$((${2:-10} * 10))
  for _ in $(seq 1 "$tenths"); do
    listening "$1" && return 0
    sleep 0.1
  done
  echo "services: nothing listens on 127.0.0.1:$1 after ${2:-10} s" >&2
  return 1
}

apt_updated=
install() { # command, Debian package
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ -z "$apt_updated" ]; then
    apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

start_mosquitto() {
  install mosquitto mosquitto
  mkdir -p /var/log/mosquitto
  chown mosquitto /var/log/mosquitto
  cat >/etc/mosquitto/wrpc-broker.conf <<'EOF'
# Written by wrpc-broker's scripts/services.sh: a loopback-only broker for the tests.
listener 1883 127.0.0.1
allow_anonymous true
persistence false
log_dest file /var/log/mosquitto/wrpc-broker.log
EOF
  mosquitto -d -c /etc/mosquitto/wrpc-broker.conf
  wait_for 1883
}

ensure() { # name, port [start function, default start_<name>]
  if listening "$2"; then
    if [ "$(type -t server_answers)" != function ] || server_answers; then
      say "$1 answers on 127.0.0.1:$2"
      return 0
    fi
    say "$1 listens on 127.0.0.1:$2 but does not answer: restarting it"
    stop_server
  fi
  local began=$SECONDS
  "${3:-start_$1}"
  say "$1 started on 127.0.0.1:$2 in $((SECONDS - began)) s"
}

repo="$(cd "$here/.." && pwd)"
for recipe in "$repo"/adapters/*/server.sh; do
  name=$(basename "$(dirname "$recipe")")
  unset -f server_answers stop_server
  # shellcheck source=/dev/null
  source "$recipe"
  ensure "$name" "$server_port" start_server
done
unset -f server_answers stop_server
ensure mosquitto 1883
say "redis 6379, nats 4222, rabbitmq 5672, mosquitto 1883 and kafka 9092 answer on 127.0.0.1"
