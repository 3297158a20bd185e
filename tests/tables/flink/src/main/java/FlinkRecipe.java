// Runs recipes/flink/pods.sql in an embedded Flink (a local MiniCluster in this JVM, streaming
// mode, parallelism 1) over a real Kafka topic, and prints the live rows of one of its views as
// `key,uid,resource_version` lines sorted by key.
//
// usage: FlinkRecipe RECIPE BOOTSTRAP TOPIC VIEW [ORDER_COLUMN]
//
// The recipe's broker ('kafka:9092') and topic ('prod-eu-1.pods') are replaced by BOOTSTRAP and
// TOPIC, and every Kafka table is made bounded ('scan.bounded.mode' = 'latest-offset', the kafka
// one read from 'earliest-offset'), so the query ends once it has read what the topic held when
// it started. The changelog of `SELECT key, uid, resource_version FROM VIEW` is applied row by
// row (+I/+U insert, -U/-D delete) and what is left is printed. With ORDER_COLUMN other than
// `version` (e.g. resourceVersion), VIEW, a view with ROW_NUMBER(), ranks by
// CAST(watchrelay.ORDER_COLUMN AS DECIMAL(38, 0)) instead of the version: what a table without
// the version would hold.
//
// FLINK_RECIPE_TIMEOUT (seconds, default 300) bounds the whole run.

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.util.CloseableIterator;

public final class FlinkRecipe {
    private static final String RECIPE_BROKER = "'kafka:9092'";
    private static final String RECIPE_TOPIC = "'prod-eu-1.pods'";
    private static final Pattern CONNECTOR =
            Pattern.compile("'connector'\\s*=\\s*'(kafka|upsert-kafka)'");
    private static final Pattern STARTUP = Pattern.compile("'scan\\.startup\\.mode'\\s*=\\s*'[^']*'");

    public static void main(String[] args) throws Exception {
        // Before any logger exists: slf4j-simple writes to stderr, warnings and errors only
        // (-Dorg.slf4j.simpleLogger.defaultLogLevel=info shows what Flink does).
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        // Warnings every local, bounded run gives, saying nothing about the recipe or the data:
        // no log file for the web UI, no delegation tokens, long operator names, partition
        // discovery and offset commits off (bounded, no checkpoints), and the collect sink
        // finding the per-job MiniCluster already shut down once the job has finished (the
        // rows left then come from the job's accumulators; a failure there still throws), and
        // the cluster's own shutdown racing the JVM's exit.
        for (String quiet : List.of(
                "org.apache.flink.runtime.webmonitor.WebMonitorUtils",
                "org.apache.flink.runtime.security.token.DefaultDelegationTokenManager",
                "org.apache.flink.runtime.metrics.util.MetricUtils",
                "org.apache.flink.connector.kafka.source.KafkaSourceBuilder",
                "org.apache.flink.connector.kafka.source.reader.KafkaSourceReader",
                "org.apache.flink.streaming.api.operators.collect",
                "org.apache.flink.runtime.rpc.RpcEndpoint$MainThreadExecutor",
                "org.apache.pekko.actor.CoordinatedShutdown")) {
            System.setProperty("org.slf4j.simpleLogger.log." + quiet, "error");
        }
        if (args.length < 4 || args.length > 5) {
            System.err.println("usage: FlinkRecipe RECIPE BOOTSTRAP TOPIC VIEW [ORDER_COLUMN]");
            System.exit(2);
        }
        String view = args[3];
        String orderColumn = args.length > 4 ? args[4] : null;
        List<String> statements =
                statements(Files.readString(Path.of(args[0])), quote(args[1]), quote(args[2]), view, orderColumn);

        // Flink unpacks its RPC system (a 21 MB jar) and keeps the MiniCluster's files under the
        // temporary directory, and leaves them there when the JVM exits: give it one of its
        // own, set before any Flink class reads it, and remove it at the end.
        Path tmp = Path.of(System.getProperty("java.io.tmpdir"),
                "flink-recipe-" + ProcessHandle.current().pid() + "-" + System.nanoTime());
        Files.createDirectories(tmp);
        System.setProperty("java.io.tmpdir", tmp.toString());

        long timeout = Long.parseLong(System.getenv().getOrDefault("FLINK_RECIPE_TIMEOUT", "300"));
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(timeout * 1000);
            } catch (InterruptedException e) {
                return;
            }
            System.err.println("FlinkRecipe: no result after " + timeout + " s");
            delete(tmp);
            Runtime.getRuntime().halt(3);
        });
        watchdog.setDaemon(true);
        watchdog.start();

        int status = 0;
        try {
            System.out.print(run(statements, view, tmp));
            System.out.flush();
        } catch (Throwable e) {
            e.printStackTrace();
            status = 1;
        } finally {
            delete(tmp);
        }
        // The MiniCluster's threads would keep the JVM up a while longer.
        System.exit(status);
    }

    // Runs the statements, then the query of VIEW to its end; returns the CSV lines.
    static String run(List<String> statements, String view, Path tmp) throws Exception {
        Configuration conf = Configuration.fromMap(Map.of(
                "parallelism.default", "1",
                "table.exec.resource.default-parallelism", "1",
                "io.tmp.dirs", tmp.toString(),
                "rest.bind-address", "127.0.0.1",
                "rest.address", "127.0.0.1"));
        TableEnvironment env = TableEnvironment.create(
                EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf).build());
        for (String statement : statements) {
            env.executeSql(statement);
        }

        // The view's final contents: its changelog applied to a map keyed by `key`.
        Map<String, String> live = new TreeMap<>();
        TableResult result = env.executeSql("SELECT `key`, uid, resource_version FROM " + view);
        try (CloseableIterator<Row> rows = result.collect()) {
            while (rows.hasNext()) {
                Row row = rows.next();
                String key = (String) row.getField(0);
                switch (row.getKind()) {
                    case INSERT:
                    case UPDATE_AFTER:
                        live.put(key, key + "," + row.getField(1) + "," + row.getField(2));
                        break;
                    case UPDATE_BEFORE:
                    case DELETE:
                        live.remove(key);
                        break;
                }
            }
        }
        StringBuilder out = new StringBuilder();
        for (String line : live.values()) {
            out.append(line).append('\n');
        }
        return out.toString();
    }

    private static void delete(Path dir) {
        try (Stream<Path> paths = Files.walk(dir)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException | UncheckedIOException e) {
            // Best effort: a file still being written may be gone already.
        }
    }

    // The recipe's statements, comments dropped, with the broker, the topic, the bounds and the
    // ordering column of `view` put in.
    static List<String> statements(
            String sql, String broker, String topic, String view, String orderColumn) {
        boolean reorder = orderColumn != null && !orderColumn.equals("version");
        Pattern ranked = Pattern.compile("(?s)\\s*CREATE VIEW " + Pattern.quote(view) + "\\s.*ROW_NUMBER\\(\\).*");
        sql = sql.replaceAll("--[^\n]*", "");
        require(sql.contains(RECIPE_BROKER), "the recipe names no broker " + RECIPE_BROKER);
        require(sql.contains(RECIPE_TOPIC), "the recipe names no topic " + RECIPE_TOPIC);
        sql = sql.replace(RECIPE_BROKER, broker).replace(RECIPE_TOPIC, topic);
        List<String> out = new ArrayList<>();
        int reordered = 0;
        for (String statement : sql.split(";")) {
            if (statement.isBlank()) {
                continue;
            }
            Matcher connector = CONNECTOR.matcher(statement);
            if (connector.find()) {
                String bounds = ",\n    'scan.bounded.mode' = 'latest-offset'";
                if (connector.group(1).equals("kafka")) {
                    if (STARTUP.matcher(statement).find()) {
                        statement = STARTUP.matcher(statement)
                                .replaceAll("'scan.startup.mode' = 'earliest-offset'");
                    } else {
                        bounds += ",\n    'scan.startup.mode' = 'earliest-offset'";
                    }
                }
                statement = statement.substring(0, connector.end()) + bounds
                        + statement.substring(connector.end());
            }
            if (reorder && ranked.matcher(statement).matches()) {
                int n = count(statement, "watchrelay.version");
                require(n == 1, "the ranked view names watchrelay.version " + n + " times, not once");
                statement = statement.replace("watchrelay.version", "watchrelay.`" + orderColumn + "`");
                reordered++;
            }
            out.add(statement.strip());
        }
        require(!reorder || reordered == 1, "the recipe has no view " + view + " with ROW_NUMBER()");
        return out;
    }

    private static String quote(String s) {
        return "'" + s.replace("'", "''") + "'";
    }

    private static int count(String s, String part) {
        int n = 0;
        for (int i = s.indexOf(part); i >= 0; i = s.indexOf(part, i + part.length())) {
            n++;
        }
        return n;
    }

    private static void require(boolean ok, String message) {
        if (!ok) {
            System.err.println("FlinkRecipe: " + message);
            System.exit(2);
        }
    }
}
