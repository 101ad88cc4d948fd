#!/bin/sh
# A RabbitMQ node of a test's own (the restart test): `own-node.sh <port> <data dir>`. Its own
# node name (wrpc-restart-<port>@localhost), AMQP port, distribution port and data, log and
# plugin files under <data dir>, loopback only; the shared node's /etc/rabbitmq/rabbitmq-env.conf
# is not read. It runs in the foreground as the Erlang VM itself (RUNNING_UNDER_SYSTEMD: the
# script execs erl, no signal-forwarding shell), so the process the test kills with SIGKILL is
# the broker.
set -eu
port=$1
data=$2
mkdir -p "$data/mnesia" "$data/log"
[ -f "$data/enabled_plugins" ] || echo '[].' >"$data/enabled_plugins"
: >"$data/rabbitmq-env.conf"
export HOME="$data"
export RABBITMQ_CONF_ENV_FILE="$data/rabbitmq-env.conf"
export RABBITMQ_NODENAME="wrpc-restart-$port@localhost"
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT="$port"
export RABBITMQ_DIST_PORT=$((port % 20000 + 40000))
export RABBITMQ_MNESIA_BASE="$data/mnesia"
export RABBITMQ_LOG_BASE="$data/log"
export RABBITMQ_ENABLED_PLUGINS_FILE="$data/enabled_plugins"
export RABBITMQ_CONFIG_FILE="$data/rabbitmq"
export RABBITMQ_ADVANCED_CONFIG_FILE="$data/advanced.config"
export RABBITMQ_PID_FILE="$data/pid"
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
export RUNNING_UNDER_SYSTEMD=1
exec /usr/lib/rabbitmq/bin/rabbitmq-server
