#!/bin/sh
# An Apache Kafka of a test's own (the restart test): `own-broker.sh <port> <data dir>`. One
# combined KRaft broker and controller on 127.0.0.1:<port> (controller on <port>+1), its log
# dirs under <data dir>, formatted on first start only (a restart keeps the data), from the jars
# scripts/kafka.sh installed. It execs the JVM, so the process the test kills is the broker.
set -euf # -f: the classpath `libs/*` is the JVM's wildcard, never a shell glob
port=$1
data=$2
here="$(cd "$(dirname "$0")" && pwd)"
conf="$here/../../../../scripts/kafka"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$conf/pom.xml")"
libs="${WRPC_KAFKA_HOME:-$HOME/.cache/wrpc-broker/kafka-$version}/libs"
[ -f "$libs/.complete" ] || { echo "no Kafka jars in $libs: run scripts/kafka.sh install" >&2; exit 1; }
controller=$((port + 1))
props="$data/server.properties"
sed -e "s/9093/$controller/g" -e "s/9092/$port/g" "$conf/server.properties" >"$props"
echo "log.dirs=$data/logs" >>"$props"
if [ ! -f "$data/logs/meta.properties" ]; then
  tool="java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=$conf/tools-log4j2.yaml -cp $libs/*"
  cluster="$($tool kafka.tools.StorageTool random-uuid)"
  $tool kafka.tools.StorageTool format --standalone -t "$cluster" -c "$props" >/dev/null
fi
exec java -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true -Dkafka.logs.dir="$data" \
  -Dlog4j2.configurationFile="$conf/log4j2.yaml" -cp "$libs/*" kafka.Kafka "$props"
