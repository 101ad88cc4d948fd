# The RabbitMQ node the tests use, sourced by scripts/services.sh (which defines `install` and
# `wait_for`): Debian's rabbitmq-server 3.10 on 127.0.0.1:5672, guest/guest.
# RabbitMQ's environment file is read by rabbitmq-server and by rabbitmqctl alike: the node is
# rabbit@localhost, and AMQP, epmd and Erlang distribution (server and CLI) bind loopback only.
# It is written before the install, so that it holds even for a package script that starts the
# node. No plugin is enabled. The default user guest/guest may connect from loopback only.
# The node keeps its data in a directory of its own, emptied each time this starts it: the
# tests' queues and streams do not pile up from run to run (thousands of quorum queues made a
# node restart slowly, then hang).
server_port=5672
data_dir=/var/lib/rabbitmq/wrpc-broker
start_server() {
  mkdir -p /etc/rabbitmq
  cat >/etc/rabbitmq/rabbitmq-env.conf <<ENV
# Written by wrpc-broker's scripts/services.sh: a loopback-only node for the tests.
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=5672
ERL_EPMD_ADDRESS=127.0.0.1
MNESIA_BASE=$data_dir
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
  install rabbitmq-server rabbitmq-server
  rm -rf "$data_dir"
  mkdir -p "$data_dir"
  chown rabbitmq:rabbitmq "$data_dir"
  rabbitmq-server -detached
  wait_for 5672 120
  rabbitmqctl -q await_startup --timeout 60 >/dev/null
}

# Whether the node answers AMQP, not only its port: a Connection.Start frame (type 1) within
# 5 s of the protocol header. A node here once kept 5672 open while it hung.
server_answers() {
  local first
  first=$(timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$server_port"'; printf "AMQP\x00\x00\x09\x01" >&3; head -c 1 <&3 | od -An -tx1' 2>/dev/null) || return 1
  [ "${first// /}" = 01 ]
}

# Stop a node that does not answer (SIGKILL: a hung node does not hear `rabbitmqctl stop`).
stop_server() {
  pkill -9 -f 'beam.smp.*rabbit' || true
  pkill -9 -x epmd || true
  for _ in $(seq 1 100); do
    listening "$server_port" || return 0
    sleep 0.1
  done
}
