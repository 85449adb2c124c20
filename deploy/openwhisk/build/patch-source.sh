#!/usr/bin/env bash
# patch-source.sh DIR: what Maven Central and Scala 2.13.16 need of a copy of
# an apache/openwhisk checkout (run by hack/openwhisk-build.sh on its copy,
# never on the checkout). Each change says which artifact or compiler
# behaviour it answers; none changes what the controller or invoker do.
set -euo pipefail
s=$1
c=$1/common/scala/src/main/scala/org/apache/openwhisk
docker=$1/core/invoker/src/main/scala/org/apache/openwhisk/core/containerpool/docker
# pekko-connectors-file is not served: file-tailing log stores and the
# Docker factories (the Kubernetes factory is what is used).
rm -f "$c/core/database/ActivationFileStorage.scala" \
	"$c/core/database/ArtifactWithFileStorageActivationStore.scala" \
	"$c/core/containerpool/logging/DockerToActivationFileLogStore.scala" \
	"$c/core/containerpool/logging/ElasticSearchLogStore.scala"
# Standalone still needs WindowsDockerClient from the standalone Docker factory,
{
	sed -n '1,/^import scala.concurrent/p' "$docker/StandaloneDockerContainerFactory.scala"
	sed -n '/^trait WindowsDockerClient/,/^}/p' "$docker/StandaloneDockerContainerFactory.scala"
} >"$docker/WindowsDockerClient.scala"
# ... and the Kubernetes container its log stage from the Docker container.
{
	sed -n '1,/^import org.apache.openwhisk.http.Messages/p' "$docker/DockerContainer.scala"
	sed -n '/^class CompleteAfterOccurrences/,$p' "$docker/DockerContainer.scala"
} >"$docker/CompleteAfterOccurrences.scala"
rm -f "$docker/DockerClientWithFileAccess.scala" "$docker/DockerContainer.scala" \
	"$docker/DockerContainerFactory.scala" "$docker/DockerForMacContainerFactory.scala" \
	"$docker/DockerCliLogStore.scala" "$docker/StandaloneDockerContainerFactory.scala"
# Artifact and attachment stores standalone does not use (S3 at the pinned
# version is not served; Azure, CosmosDB and MongoDB drivers are large).
rm -rf "$c/core/database/s3" "$c/core/database/azblob" "$c/core/database/cosmosdb" "$c/core/database/mongodb"
# kamon-statsd is not served for Scala 2.13.
sed -i '/^import kamon.statsd/d; /^class WhiskStatsDMetricKeyGenerator/,/^}/d' "$c/common/Logging.scala"
# Kamon 2.5 has no Kamon.scheduler().
sed -i 's/Kamon\.scheduler()/java.util.concurrent.Executors.newSingleThreadScheduledExecutor()/' \
	"$c/connector/kafka/KamonMetricsReporter.scala"
# pekko-kryo-serialization is not served.
sed -i '/^import io.altoo/d; /^class CompatibleKryoInitializer/,/^}/d' \
	"$1/core/scheduler/src/main/scala/org/apache/openwhisk/core/scheduler/Scheduler.scala"
# Scala 2.13.16 rejects @throws on classes; it only documents.
find "$s/common" "$s/core" "$s/tools/admin" -name '*.scala' -path '*/src/main/*' \
	-exec sed -i -E '/^[[:space:]]*@throws\[[A-Za-z.]+\][[:space:]]*$/d' {} +

# Standalone's Docker client fails its constructor when `docker version`
# fails (no daemon), and standalone makes one even with --dev-kcf, where
# Docker serves only the optional services (API gateway, CouchDB, Kafka UI).
sed -i '/^class StandaloneDockerClient/,/with WindowsDockerClient {/{
/with WindowsDockerClient {/a\
  override protected def getClientVersion(): String =\
    scala.util.Try(super.getClientVersion()).getOrElse("none")
}' "$s/core/standalone/src/main/scala/org/apache/openwhisk/standalone/StandaloneDockerSupport.scala"

# Scala 2.13 serialises the invoker's activation fields (a Map[String, JsValue])
# with spray-json's iterable format, a JSON array of pairs, and asJsObject
# then fails every /run ("JSON object expected", a whisk internal error):
# the fields (an Iterable of pairs to 2.13) are made a JSON object directly.
sed -i 's/env\.toJson\.asJsObject/JsObject(env.toMap[String, JsValue])/' \
	"$s/core/invoker/src/main/scala/org/apache/openwhisk/core/containerpool/ContainerProxy.scala" \
	"$s/core/invoker/src/main/scala/org/apache/openwhisk/core/containerpool/v2/FunctionPullingContainerProxy.scala"
