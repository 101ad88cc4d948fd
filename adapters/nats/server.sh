# The NATS server the tests use, sourced by scripts/services.sh (which defines `install` and
# `wait_for`): Debian's nats-server 2.9 with JetStream on 127.0.0.1:4222.
server_port=4222
start_server() {
  install nats-server nats-server
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for 4222
}
