// A Java consumer on Kafka 4's new consumer protocol (group.protocol=consumer, KIP-848), for
// tests/integration/test_describe_live.py: java -cp "<kafka libs>/*" NewProtocolConsumer.java
// BOOTSTRAP GROUP TOPIC. Prints "assigned [...]" after each poll until killed.
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.KafkaConsumer;

public class NewProtocolConsumer {
  public static void main(String[] args) {
    Properties props = new Properties();
    props.put("bootstrap.servers", args[0]);
    props.put("group.id", args[1]);
    props.put("group.protocol", "consumer");
    props.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
    props.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      consumer.subscribe(List.of(args[2]));
      while (true) {
        consumer.poll(Duration.ofMillis(300));
        System.out.println("assigned " + consumer.assignment());
        System.out.flush();
      }
    }
  }
}
