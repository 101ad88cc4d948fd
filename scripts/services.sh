#!/usr/bin/env bash
# Starts the broker servers the tests talk to, unless they already answer: Redis on
# 127.0.0.1:6379 and NATS with JetStream on 127.0.0.1:4222 (installed from Debian when absent).
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {
  for _ in $(seq 1 100); do
    listening "$1" && return 0
    sleep 0.1
  done
  echo "services: nothing listens on 127.0.0.1:$1 after 10 s" >&2
  return 1
}

install() {
  command -v "$1" >/dev/null 2>&1 && return 0
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2") >/dev/null
}

if ! listening 6379; then
  install redis-server redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for 6379
fi

if ! listening 4222; then
  install nats-server nats-server
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for 4222
fi
echo "services: redis 127.0.0.1:6379 and nats 127.0.0.1:4222 answer"
