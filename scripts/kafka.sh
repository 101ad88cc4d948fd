#!/usr/bin/env bash
# Apache Kafka for the tests, run from its Maven Central jars: one combined KRaft broker and
# controller on 127.0.0.1:9092 (controller on 127.0.0.1:9093), a fresh cluster each start.
#   scripts/kafka.sh install   fetch the jars (skipped when present) into $WRPC_KAFKA_HOME
#   scripts/kafka.sh start     format a fresh data dir, start in the background, wait until ready
#   scripts/kafka.sh stop      stop the broker started by `start` (pid file)
# The version is the pom's (scripts/kafka/pom.xml). Jars, data, log and pid file live outside the
# clone, in ${WRPC_KAFKA_HOME:-$HOME/.cache/wrpc-broker/kafka-<version>}; the broker logs to
# run/kafka.log there. KAFKA_HEAP_OPTS overrides the broker's heap (default -Xmx512m).
set -euo pipefail

conf="$(cd "$(dirname "$0")" && pwd)/kafka"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$conf/pom.xml")"
home="${WRPC_KAFKA_HOME:-$HOME/.cache/wrpc-broker/kafka-$version}"
libs="$home/libs"
run="$home/run"
pid_file="$run/kafka.pid"
log="$run/kafka.log"
port=9092
ready_seconds=90

say() { echo "kafka: $*"; }
die() { echo "kafka: $*" >&2; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

need() { # command, Debian package
  command -v "$1" >/dev/null 2>&1 && return 0
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2") >/dev/null
}

# A short-lived JVM on the broker's classpath (storage tool, CLIs), logging WARN to stderr.
tool=(java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  -Dlog4j2.configurationFile="$conf/tools-log4j2.yaml" -cp "$libs/*")

running() {
  local pid
  pid="$(cat "$pid_file" 2>/dev/null)" || return 1
  grep -qa kafka.Kafka "/proc/$pid/cmdline" 2>/dev/null
}

install() {
  need java openjdk-17-jre-headless
  need mvn maven
  if [ -f "$libs/.complete" ]; then
    say "$version jars already in $libs"
    return 0
  fi
  say "fetching Kafka $version jars from Maven Central into $libs"
  # into a side dir first: a download cut short never looks complete, and no jar of another
  # version is left over (copy-dependencies never deletes)
  rm -rf "$libs.part"
  mkdir -p "$home"
  mvn -B -ntp -f "$conf/pom.xml" -Dkafka.libs.dir="$libs.part" dependency:copy-dependencies \
    >"$home/mvn.log" 2>&1 || { tail -n 40 "$home/mvn.log" >&2; die "maven failed (log: $home/mvn.log)"; }
  touch "$libs.part/.complete"
  rm -rf "$libs"
  mv "$libs.part" "$libs"
  say "$(find "$libs" -name '*.jar' | wc -l) jars, $(du -sh "$libs" | cut -f1)"
}

# Ready when the broker port answers, the broker logged that it started and a metadata request
# (list topics) succeeds; the port only opens once the broker is unfenced.
wait_ready() {
  local deadline=$((SECONDS + ready_seconds))
  until listening "$port" && grep -q 'Kafka Server started' "$log"; do
    running || fail "the broker exited while starting"
    [ "$SECONDS" -lt "$deadline" ] || fail "not ready after $ready_seconds s"
    sleep 0.5
  done
  timeout 30 "${tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$port" --list >/dev/null \
    || fail "listing topics on 127.0.0.1:$port failed"
}

fail() { # a broker that did not come up is stopped, so that the next start begins afresh
  tail -n 60 "$log" >&2
  stop >&2
  die "$1 (log: $log)"
}

start() {
  if running; then
    say "already running (pid $(cat "$pid_file")) on 127.0.0.1:$port"
    return 0
  fi
  ! listening "$port" || die "something else answers on 127.0.0.1:$port"
  [ -f "$libs/.complete" ] || install
  local began=$SECONDS cluster_id
  rm -rf "$run"
  mkdir -p "$run"
  # properties files expand no variables: the data dir is appended here
  { cat "$conf/server.properties"; echo "log.dirs=$run/data"; } >"$run/server.properties"
  cluster_id="$("${tool[@]}" kafka.tools.StorageTool random-uuid)"
  "${tool[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$run/server.properties" >/dev/null
  # setsid: a Ctrl-C in the caller's terminal does not reach the broker
  # shellcheck disable=SC2086 # KAFKA_HEAP_OPTS holds several options
  setsid java ${KAFKA_HEAP_OPTS:--Xmx512m} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
    -Dkafka.logs.dir="$run" -Dlog4j2.configurationFile="$conf/log4j2.yaml" \
    -cp "$libs/*" kafka.Kafka "$run/server.properties" >"$log" 2>&1 </dev/null &
  echo $! >"$pid_file"
  wait_ready
  say "Kafka $version ready on 127.0.0.1:$port in $((SECONDS - began)) s (pid $(cat "$pid_file"), cluster $cluster_id, log $log)"
}

stop() {
  if ! running; then
    say "not running"
    rm -f "$pid_file"
    return 0
  fi
  local pid
  pid="$(cat "$pid_file")"
  kill "$pid" 2>/dev/null || true # SIGTERM: the shutdown hook stops the broker cleanly
  for _ in $(seq 1 60); do
    running || break
    sleep 0.5
  done
  if running; then
    say "still up after 30 s, killing pid $pid"
    kill -9 "$pid"
  fi
  rm -f "$pid_file"
  say "stopped"
}

case "${1:-}" in
  install | start | stop) "$1" ;;
  *) die "usage: $0 install|start|stop" ;;
esac
