# The Kafka the tests use, sourced by scripts/services.sh (which defines `install` and
# `wait_for`): Apache Kafka from its Maven Central jars, one combined KRaft broker and
# controller on 127.0.0.1:9092 (scripts/kafka.sh: install time, start time and memory there).
server_port=9092
start_server() {
  "$repo/scripts/kafka.sh" install
  "$repo/scripts/kafka.sh" start
}
