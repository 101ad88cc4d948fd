# The Redis server the tests use, sourced by scripts/services.sh (which defines `install` and
# `wait_for`): Debian's redis-server 7.0 on 127.0.0.1:6379, nothing on disk.
server_port=6379
start_server() {
  install redis-server redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for 6379
}
