# The RabbitMQ node the tests use, sourced by scripts/services.sh (which defines `install` and
# `wait_for`): Debian's rabbitmq-server 3.10 on 127.0.0.1:5672, guest/guest.
# RabbitMQ's environment file is read by rabbitmq-server and by rabbitmqctl alike: the node is
# rabbit@localhost, and AMQP, epmd and Erlang distribution (server and CLI) bind loopback only.
# It is written before the install, so that it holds even for a package script that starts the
# node. No plugin is enabled. The default user guest/guest may connect from loopback only.
server_port=5672
start_server() {
  mkdir -p /etc/rabbitmq
  cat >/etc/rabbitmq/rabbitmq-env.conf <<'ENV'
# Written by wrpc-broker's scripts/services.sh: a loopback-only node for the tests.
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=5672
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
  install rabbitmq-server rabbitmq-server
  rabbitmq-server -detached
  wait_for 5672 120
  rabbitmqctl -q await_startup --timeout 60 >/dev/null
}
